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
 * - a JSend **error** (5xx): `code` is the classified code when the server
 *   gives one (`guest_unavailable`, `guest_timeout`, `host_capacity`,
 *   `insufficient_storage`), else `"server_error"`;
 * - no answer at all (connection refused or reset, a WebSocket that could
 *   not be opened): `status` is `0` and `code` is `"network_error"`;
 * - a sandbox that ended in state `error` while the SDK waited for it:
 *   `code` `"sandbox_error"`, `message` the record's `error`;
 * - an SDK-side refusal (no configuration, a bad argument): `status` `0`
 *   and a code of its own (`"not_configured"`, `"invalid_argument"`, …).
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
  readonly code: string;
  /** The HTTP status of the answer; `0` when there was none. */
  readonly status: number;
  /** The fields of the answer beside `code` and `message` (`field`, `path`, `state`, …); `{}` when none. */
  readonly data: Record<string, unknown>;
  /** The answer's `X-Request-Id`, to quote when reporting a problem. */
  readonly requestId: string | undefined;

  /**
   * @param code - the stable code
   * @param message - a sentence for people
   * @param status - the HTTP status, `0` when there was no answer
   * @param data - the answer's other fields
   * @param requestId - the answer's `X-Request-Id`
   * @param options - `cause`: the underlying error, if any
   */
  constructor(
    code: string,
    message: string,
    status = 0,
    data: Record<string, unknown> = {},
    requestId?: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "StrataError";
    this.code = code;
    this.status = status;
    this.data = data;
    this.requestId = requestId;
  }

  /** `code: message (HTTP status, request id)`, for logs. */
  override toString(): string {
    const where = this.status ? ` (HTTP ${this.status}${this.requestId ? `, request ${this.requestId}` : ""})` : "";
    return `StrataError ${this.code}: ${this.message}${where}`;
  }
}
