/**
 * Files in and out of a running sandbox: `sb.files`.
 *
 * @module
 */
import { spawn } from "node:child_process";
import { mkdir, readdir } from "node:fs/promises";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { camel, dataOf, sandboxPath } from "./client.js";
import { StrataError } from "./errors.js";
/** The route path of an absolute path in the guest (`/` is `…/files`). */
function filesPath(sandbox, path) {
    if (!path.startsWith("/"))
        throw new StrataError("invalid_argument", `a sandbox path is absolute: ${JSON.stringify(path)}`);
    const segs = path.split("/").filter((s) => s !== "");
    return sandboxPath(sandbox, "files") + (segs.length ? "/" + segs.map(encodeURIComponent).join("/") : "");
}
function writeHeaders(contentType, o) {
    const h = { "Content-Type": contentType };
    if (o.mode !== undefined)
        h["X-File-Mode"] = (o.mode & 0o7777).toString(8).padStart(4, "0");
    if (o.mtime)
        h["X-File-Mtime"] = o.mtime.toISOString();
    return h;
}
/** An async iterable of bytes as a web ReadableStream. */
function toStream(src) {
    if (src instanceof ReadableStream)
        return src;
    const it = src[Symbol.asyncIterator]();
    return new ReadableStream({
        async pull(ctl) {
            const { value, done } = await it.next();
            if (done)
                ctl.close();
            else
                ctl.enqueue(value);
        },
        async cancel() {
            await it.return?.();
        },
    });
}
/** Runs the system's tar with args; its stdio streams never throw unhandled errors. */
function runTar(args, stdio) {
    const proc = spawn("tar", args, { stdio });
    let err = "";
    const noop = () => { };
    proc.stdin?.on("error", noop);
    proc.stdout?.on("error", noop);
    proc.stderr?.on("error", noop);
    proc.stderr?.on("data", (b) => {
        if (err.length < 4096)
            err += b.toString();
    });
    const exit = new Promise((resolve, reject) => {
        proc.on("error", (e) => reject(new StrataError("tar_failed", `could not run tar: ${e.message}`, 0, {}, undefined, { cause: e })));
        proc.on("close", (code, signal) => resolve(code ?? (signal ? 128 : 1)));
    });
    exit.catch(noop);
    return {
        proc,
        exit,
        stderr: () => err.trim(),
        kill() {
            if (proc.exitCode === null && proc.signalCode === null && proc.pid !== undefined)
                proc.kill("SIGKILL");
        },
    };
}
/** Resolves once tar runs; rejects with its `tar_failed` when it cannot be run (no tar on the PATH). */
function started(tar) {
    return new Promise((resolve, reject) => {
        tar.proc.once("spawn", () => resolve());
        tar.exit.catch(reject);
    });
}
/**
 * Files of a running sandbox: `sb.files`. Bodies stream both ways; a file
 * may be as large as the receiving side has room for.
 *
 * Directories go as tar (`upload`, `download`): this SDK shells out to the
 * system's `tar` to pack and unpack them (GNU tar or bsdtar), rather than
 * carry a tar implementation of its own.
 *
 * @example
 * ```ts
 * await sb.files.write("/app/main.py", "print(42)\n", { mode: 0o755, parents: true });
 * console.log(await sb.files.readText("/app/main.py"));
 * ```
 */
export class Files {
    client;
    sandboxId;
    /** @internal */
    constructor(client, sandboxId) {
        this.client = client;
        this.sandboxId = sandboxId;
    }
    /**
     * Writes a file (created or replaced atomically once whole).
     *
     * @param path - an absolute path in the sandbox
     * @param data - the content: a string (UTF-8) or bytes
     * @param options - mode, parents, mtime
     * @returns the path and the bytes written
     */
    async write(path, data, options = {}) {
        const body = typeof data === "string" ? new TextEncoder().encode(data) : data instanceof Uint8Array ? data : new Uint8Array(data);
        const { data: out } = await this.client.call("PUT", filesPath(this.sandboxId, path), {
            body,
            headers: writeHeaders("application/octet-stream", options),
            query: { parents: options.parents ? "true" : undefined },
        });
        return camel(out);
    }
    /**
     * Writes a file from a stream, never holding it whole.
     *
     * @param path - an absolute path in the sandbox
     * @param source - a web ReadableStream or any async iterable of bytes (a Node Readable is one)
     * @param options - mode, parents, mtime
     * @returns the path and the bytes written
     */
    async writeStream(path, source, options = {}) {
        const { data } = await this.client.call("PUT", filesPath(this.sandboxId, path), {
            body: toStream(source),
            headers: writeHeaders("application/octet-stream", options),
            query: { parents: options.parents ? "true" : undefined },
        });
        return camel(data);
    }
    /**
     * Reads a whole file.
     *
     * @param path - an absolute path in the sandbox
     * @returns its bytes
     * @throws {@link StrataError} `file_not_found` (404), `not_a_file` (409: not a regular file); `invalid_argument` for a directory
     */
    async read(path) {
        const res = await this.open(path);
        return new Uint8Array(await res.arrayBuffer());
    }
    /**
     * Reads a whole file as text.
     *
     * @param path - an absolute path in the sandbox
     * @returns its content, decoded as UTF-8
     */
    async readText(path) {
        return new TextDecoder().decode(await this.read(path));
    }
    /**
     * Reads a file as a stream.
     *
     * @param path - an absolute path in the sandbox
     * @returns its bytes, as they come
     */
    async readStream(path) {
        const res = await this.open(path);
        return res.body ?? new ReadableStream({ start: (c) => c.close() });
    }
    async open(path) {
        const p = filesPath(this.sandboxId, path);
        const { response } = await this.client.call("GET", p, { raw: true, headers: { Accept: "application/octet-stream" } });
        if (!(response.headers.get("Content-Type") ?? "").startsWith("application/octet-stream")) {
            await response.body?.cancel();
            throw new StrataError("invalid_argument", `${path} is a directory, not a file`, 0, { path, type: "dir" });
        }
        return response;
    }
    /**
     * Lists a directory. A file's path is refused as soon as the answer's
     * headers tell it is a file (its content is not read).
     *
     * @param dir - an absolute path in the sandbox
     * @returns its entries
     * @throws {@link StrataError} `file_not_found` (404); `invalid_argument` when `dir` is a file
     */
    async list(dir) {
        const p = filesPath(this.sandboxId, dir);
        const { response } = await this.client.call("GET", p, { raw: true, headers: { Accept: "application/json" } });
        if (!(response.headers.get("Content-Type") ?? "").startsWith("application/json")) {
            await response.body?.cancel();
            throw new StrataError("invalid_argument", `${dir} is a file, not a directory`, 0, { path: dir, type: "file" });
        }
        const data = dataOf("GET", p, response, await response.text());
        return camel(data.entries);
    }
    /**
     * Removes a file or an empty directory, or a whole tree with `recursive`.
     *
     * @param path - an absolute path in the sandbox
     * @param options - `recursive`: remove a directory with entries too
     * @throws {@link StrataError} `directory_not_empty` (409) without `recursive`
     */
    async remove(path, options = {}) {
        await this.client.call("DELETE", filesPath(this.sandboxId, path), { query: { recursive: options.recursive ? "true" : undefined } });
    }
    /**
     * Tells what is at a path (a `HEAD`).
     *
     * @param path - an absolute path in the sandbox
     * @returns its type, and for a file its size, mode and mtime
     * @throws {@link StrataError} `file_not_found` (404) when nothing is there
     */
    async stat(path) {
        const { response } = await this.client.call("HEAD", filesPath(this.sandboxId, path));
        const h = response.headers;
        if (!(h.get("Content-Type") ?? "").startsWith("application/octet-stream"))
            return { type: "dir" };
        const mtime = h.get("X-File-Mtime") ?? h.get("Last-Modified");
        const mode = h.get("X-File-Mode");
        return {
            type: "file",
            size: Number(h.get("Content-Length") ?? 0),
            mode: mode ? parseInt(mode, 8) : undefined,
            mtime: mtime ? new Date(mtime) : undefined,
        };
    }
    /**
     * Tells whether something is at a path.
     *
     * @param path - an absolute path in the sandbox
     * @returns false when `stat` would say `file_not_found`
     */
    async exists(path) {
        try {
            await this.stat(path);
            return true;
        }
        catch (e) {
            if (e instanceof StrataError && e.status === 404)
                return false;
            throw e;
        }
    }
    /**
     * Copies a local directory's tree into the sandbox, as a tar made by the
     * system's `tar` and unpacked there (modes, mtimes and symlinks kept).
     * The directory's entries are packed (`tar -C localDir -cf - -- name…`),
     * not the directory itself: `dir`'s own mode and owner are left as they are.
     * The body ends only once tar has exited successfully; a tar that fails
     * breaks the upload off, so no partial tree is taken for the whole.
     *
     * @param localDir - a directory here
     * @param dir - the directory in the sandbox (made when missing)
     * @param options - `parents`: make its missing parents too
     * @returns the directory and the bytes of the files written
     * @throws {@link StrataError} `invalid_argument` when `localDir` cannot be read; `tar_failed` when tar
     *   cannot be run or fails (`data.stderr`)
     */
    async upload(localDir, dir, options = {}) {
        let names;
        try {
            names = (await readdir(localDir)).sort();
        }
        catch (e) {
            throw new StrataError("invalid_argument", `cannot read the local directory ${localDir}: ${e.message}`, 0, { path: localDir }, undefined, { cause: e });
        }
        const target = filesPath(this.sandboxId, dir);
        const put = (body) => this.client.call("PUT", target, { body, headers: { "Content-Type": "application/x-tar" }, query: { parents: options.parents ? "true" : undefined } });
        // An empty directory is an empty archive (tar refuses to make one).
        if (names.length === 0)
            return camel((await put(new Uint8Array(1024))).data);
        // bsdtar reads a name starting with @ as an archive to copy: ./ keeps it a name.
        const tar = runTar(["-C", localDir, "-cf", "-", "--", ...names.map((n) => (n.startsWith("@") ? "./" + n : n))], ["ignore", "pipe", "pipe"]);
        await started(tar);
        let tarFailure;
        const fail = (code) => new StrataError("tar_failed", `tar -c of ${localDir} failed (exit ${code})${tar.stderr() ? ": " + tar.stderr() : ""}`, 0, { path: localDir, stderr: tar.stderr() });
        const stdout = tar.proc.stdout;
        async function* packed() {
            try {
                for await (const chunk of stdout)
                    yield new Uint8Array(chunk);
                const code = await tar.exit;
                if (code !== 0)
                    throw (tarFailure = fail(code));
            }
            catch (e) {
                tarFailure ??= e instanceof StrataError ? e : fail(-1);
                throw tarFailure;
            }
        }
        try {
            const { data } = await put(toStream(packed()));
            // The body ended once tar exited 0: nothing is left to wait for.
            return camel(data);
        }
        catch (e) {
            tar.kill();
            stdout.destroy();
            throw tarFailure ?? e;
        }
    }
    /**
     * Copies a directory's tree out of the sandbox into a local directory
     * (made when missing), as a tar unpacked by the system's `tar`. Modes are
     * the sandbox's less this process's umask, never setuid, setgid or
     * sticky, and files are this process's user's (`--no-same-permissions
     * --no-same-owner`, as tar does for a user who is not root; the same as
     * `createos sandbox cp` and the Python SDK).
     *
     * @param dir - the directory in the sandbox
     * @param localDir - the directory here
     * @throws {@link StrataError} `invalid_argument` when `dir` is a file or `localDir` cannot be made;
     *   `network_error` when the answer breaks off; `tar_failed` when tar cannot be run or fails (`data.stderr`)
     */
    async download(dir, localDir) {
        const { response } = await this.client.call("GET", filesPath(this.sandboxId, dir), { raw: true, headers: { Accept: "application/x-tar" } });
        const cancel = () => response.body?.cancel().catch(() => { });
        if (!(response.headers.get("Content-Type") ?? "").startsWith("application/x-tar")) {
            await cancel();
            throw new StrataError("invalid_argument", `${dir} is a file, not a directory`, 0, { path: dir, type: "file" });
        }
        try {
            await mkdir(localDir, { recursive: true });
        }
        catch (e) {
            await cancel();
            throw new StrataError("invalid_argument", `cannot make the local directory ${localDir}: ${e.message}`, 0, { path: localDir }, undefined, { cause: e });
        }
        // Root's tar would keep the tar's owners and every mode bit (setuid
        // included) and ignore the umask: a sandbox must not plant those here.
        const tar = runTar(["-C", localDir, "--no-same-owner", "--no-same-permissions", "-xf", "-"], ["pipe", "ignore", "pipe"]);
        try {
            await started(tar);
        }
        catch (e) {
            await cancel();
            throw e;
        }
        const fail = (code) => new StrataError("tar_failed", `tar -x into ${localDir} failed (exit ${code})${tar.stderr() ? ": " + tar.stderr() : ""}`, 0, { path: localDir, stderr: tar.stderr() });
        const body = response.body
            ? Readable.fromWeb(response.body)
            : Readable.from([]);
        try {
            await pipeline(body, tar.proc.stdin);
        }
        catch (e) {
            // Either the answer broke off (the body is errored) or tar stopped
            // reading (it exited early: EPIPE). pipeline has destroyed both ends,
            // which cancels the answer's body.
            if (body.errored) {
                tar.kill();
                await tar.exit.catch(() => { });
                throw new StrataError("network_error", `the tar of ${dir} broke off: ${e.message}`, 0, { path: dir }, undefined, { cause: e });
            }
            const timer = setTimeout(() => tar.kill(), 10_000);
            const code = await tar.exit.finally(() => clearTimeout(timer));
            // tar may stop reading after the archive's end marker and exit 0: the tree is whole.
            if (code !== 0)
                throw fail(code);
            return;
        }
        // Every byte is written and stdin is closed: tar is let finish.
        const code = await tar.exit;
        if (code !== 0)
            throw fail(code);
    }
}
//# sourceMappingURL=files.js.map