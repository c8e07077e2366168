/**
 * The one error class of the SDK.
 *
 * @module
 */
/**
 * An error of the strata API, or of the way to it.
 *
 * Every failed call throws a `StrataError`:
 *
 * - a JSend **fail** (4xx): `code` is the stable code the API documents
 *   (`invalid_field`, `sandbox_not_found`, `directory_busy`, …), `data`
 *   the fields beside it that name what failed (`field`, `path`, `holders`,
 *   `state`, …);
 * - a JSend **error** (5xx): `code` is the classified code the server
 *   gives (`guest_unavailable`, `guest_timeout`, `host_capacity`,
 *   `insufficient_storage`, …);
 * - a sandbox that settled in another state than the one waited for: the
 *   server's codes too (the failed operation's from the record's
 *   `lastError`, else `sandbox_state`), with `data.state`.
 *
 * The SDK's own codes, for errors it makes itself, are exactly these:
 *
 * - `network_error`: no answer (connection refused or reset, a timeout,
 *   a WebSocket that could not be opened); `status` `0`;
 * - `wait_timeout`: a wait for a sandbox's state ran out (`waitTimeoutMs`);
 * - `attachment_closed`: a session's attachment broke and could not be
 *   opened again, or the session was detached (`data.detached`) or has
 *   exited and is written to;
 * - `invalid_argument`: a bad argument (no configuration, a relative
 *   path, a file's path where a directory is needed…), caught before any
 *   request or from the answer's headers; `status` `0`;
 * - `http_<status>`: an answer that is not JSend, or names no code
 *   (`http_502` from a proxy, …).
 *
 * The one other is `tar_failed`: the system's `tar` that `files.upload`
 * and `files.download` run could not be run or failed (`data.stderr`).
 *
 * @example
 * ```ts
 * try {
 *   await sb.checkpoints.create({ path: "/workspace/app" });
 * } catch (e) {
 *   if (e instanceof StrataError && e.code === "directory_busy") console.log(e.data.holders);
 *   else throw e;
 * }
 * ```
 */
export class StrataError extends Error {
    /** The stable code: the JSend `code`, or one of the SDK's own (see the class). */
    code;
    /** The HTTP status of the answer; `0` when there was none. */
    status;
    /** The fields of the answer beside `code` and `message` (`field`, `path`, `state`, …); `{}` when none. */
    data;
    /** The answer's `X-Request-Id`, to quote when reporting a problem. */
    requestId;
    /**
     * @param code - the stable code
     * @param message - a sentence for people
     * @param status - the HTTP status, `0` when there was no answer
     * @param data - the answer's other fields
     * @param requestId - the answer's `X-Request-Id`
     * @param options - `cause`: the underlying error, if any
     */
    constructor(code, message, status = 0, data = {}, requestId, options) {
        super(message, options);
        this.name = "StrataError";
        this.code = code;
        this.status = status;
        this.data = data;
        this.requestId = requestId;
    }
    /** `code: message (HTTP status, request id)`, for logs. */
    toString() {
        const where = this.status ? ` (HTTP ${this.status}${this.requestId ? `, request ${this.requestId}` : ""})` : "";
        return `StrataError ${this.code}: ${this.message}${where}`;
    }
}
//# sourceMappingURL=errors.js.map