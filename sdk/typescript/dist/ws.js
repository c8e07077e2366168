/**
 * One WebSocket interface over the platform's `WebSocket` (when
 * `globalThis.WebSocket` exists) or the `ws` package (Node 20).
 *
 * @module
 */
import { StrataError } from "./errors.js";
import { errorOf } from "./client.js";
/** How long the opening handshake of an attachment may take, in ms. */
export const HANDSHAKE_TIMEOUT_MS = 30_000;
/** The subprotocol of attachments. */
const PROTOCOL = "strata.v1";
/**
 * Opens url (ws:// or wss://) with key. The platform's WebSocket cannot
 * send headers, so the key goes as a subprotocol `key.<key>` (the server
 * answers `strata.v1`); `ws` sends it as `X-Api-Key`. A refusal before the
 * upgrade is a StrataError from its JSend answer with `ws`; with the
 * platform's WebSocket, whose failures say nothing, `network_error`.
 * @internal
 */
export async function openWs(url, key, h) {
    const G = globalThis.WebSocket;
    if (G)
        return openPlatform(G, url, key, h);
    return openNodeWs(url, key, h);
}
function openPlatform(G, url, key, h) {
    return new Promise((resolve, reject) => {
        const ws = new G(url, [PROTOCOL, "key." + key]);
        ws.binaryType = "arraybuffer";
        let open = false;
        let timedOut = false;
        const timer = setTimeout(() => {
            timedOut = true;
            reject(new StrataError("network_error", `the attachment ${url.replace(/\?.*/, "")} could not be opened: no handshake in ${HANDSHAKE_TIMEOUT_MS} ms`));
            try {
                ws.close();
            }
            catch {
                // closing a socket still connecting may throw on some platforms: it is given up either way
            }
        }, HANDSHAKE_TIMEOUT_MS);
        ws.onopen = () => {
            clearTimeout(timer);
            if (timedOut) {
                ws.close(1000);
                return;
            }
            open = true;
            resolve({
                send(d) {
                    if (ws.readyState !== 1)
                        return false;
                    ws.send(d);
                    return true;
                },
                close(code, reason) {
                    ws.close(code, reason);
                },
                pause: () => false,
                resume() { },
            });
        };
        ws.onerror = () => {
            clearTimeout(timer);
            if (!open)
                reject(new StrataError("network_error", `the attachment ${url.replace(/\?.*/, "")} could not be opened`));
        };
        ws.onmessage = (e) => {
            if (typeof e.data === "string")
                h.text(e.data);
            else
                h.binary(new Uint8Array(e.data));
        };
        ws.onclose = (e) => {
            clearTimeout(timer);
            if (!open)
                reject(new StrataError("network_error", `the attachment ${url.replace(/\?.*/, "")} could not be opened (${e.code})`));
            else
                h.close(e.code, e.reason);
        };
    });
}
async function openNodeWs(url, key, h) {
    const { default: WebSocket } = await import("ws");
    return new Promise((resolve, reject) => {
        const ws = new WebSocket(url, [PROTOCOL], {
            headers: { "X-Api-Key": key },
            maxPayload: 1 << 20,
            perMessageDeflate: false,
            handshakeTimeout: HANDSHAKE_TIMEOUT_MS,
        });
        let open = false;
        ws.on("unexpected-response", (_req, res) => {
            const chunks = [];
            res.on("data", (c) => chunks.push(c));
            res.on("end", () => {
                const text = Buffer.concat(chunks).toString("utf8");
                const headers = new Headers();
                for (const [k, v] of Object.entries(res.headers))
                    if (typeof v === "string")
                        headers.set(k, v);
                reject(errorOf("GET", new URL(url).pathname, new Response(null, { status: res.statusCode ?? 500, headers }), text));
                ws.terminate();
            });
            res.on("error", (e) => reject(new StrataError("network_error", e.message, 0, {}, undefined, { cause: e })));
        });
        ws.on("open", () => {
            open = true;
            resolve({
                send(d) {
                    if (ws.readyState !== WebSocket.OPEN)
                        return false;
                    ws.send(d, { binary: typeof d !== "string" });
                    return true;
                },
                close(code, reason) {
                    ws.close(code, reason);
                },
                pause() {
                    ws.pause();
                    return true;
                },
                resume() {
                    ws.resume();
                },
            });
        });
        ws.on("error", (e) => {
            if (!open)
                reject(new StrataError("network_error", `the attachment could not be opened: ${e.message}`, 0, {}, undefined, { cause: e }));
        });
        ws.on("message", (data, isBinary) => {
            const buf = Array.isArray(data) ? Buffer.concat(data) : Buffer.isBuffer(data) ? data : Buffer.from(data);
            if (isBinary)
                h.binary(new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength));
            else
                h.text(buf.toString("utf8"));
        });
        ws.on("close", (code, reason) => {
            if (open)
                h.close(code, reason.toString("utf8"));
            else
                reject(new StrataError("network_error", `the attachment closed before it opened (${code})`));
        });
    });
}
//# sourceMappingURL=ws.js.map