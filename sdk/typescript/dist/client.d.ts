import { StrataError } from "./errors.js";
/** The credentials file guestd writes inside a sandbox (root-readable), lines `NAME='value'`. */
export declare const DEFAULT_CREDENTIALS_FILE = "/run/strata/credentials.env";
/** Options of a {@link Strata} client; every one may be left out. */
export interface StrataOptions {
    /** The API's address, `http(s)://host:port`. Default: `CREATEOS_API_URL`, then the credentials file. */
    apiUrl?: string;
    /** An account API key or a sandbox access token. Default: `CREATEOS_API_KEY`, then the credentials file. */
    apiKey?: string;
    /** The sandbox `Sandbox.connect()` means with no id. Default: `CREATEOS_SANDBOX_ID`, then the credentials file. */
    sandboxId?: string;
    /** The credentials file read for what the environment lacks. Default: `CREATEOS_CREDENTIALS`, else `/run/strata/credentials.env`. */
    credentialsFile?: string;
    /** How long a call is retried, in ms, counted from its first failure (0: never); which calls are, and when: docs/sdk.md, "Retries". Default 60000. */
    retryTimeoutMs?: number;
    /** How long `create`, `fork`, `start`, `resume` and `pause` wait for the sandbox's state, in ms. Default 300000. */
    waitTimeoutMs?: number;
    /** Called before every HTTP request and WebSocket attachment (method and path with its query), for logs and tests. */
    onRequest?: (method: string, path: string) => void;
}
/** Options of one call of {@link Strata.call}. */
export interface CallOptions {
    /** Query parameters; `undefined` values are left out, an array's values are each sent (`label=a=1&label=b=2`). */
    query?: Record<string, string | number | boolean | readonly string[] | undefined>;
    /** A JSON body (sent with `Content-Type: application/json`). */
    json?: unknown;
    /** A raw body (a stream is never retried). */
    body?: Uint8Array | ReadableStream<Uint8Array> | string;
    /** Extra request headers. */
    headers?: Record<string, string>;
    /** Send an `Idempotency-Key` (a new UUID, the same on every retry), which makes a POST retryable. */
    idempotent?: boolean;
    /** Return the `Response` as is, for streamed bodies (the SDK checks only its status). */
    raw?: boolean;
}
/** What {@link Strata.call} returns: the JSend `data` and the answer. */
export interface CallResult<T> {
    /** The JSend `data`, keys as the API spells them (snake_case). */
    data: T;
    /** The HTTP answer (its body already read, unless `raw`). */
    response: Response;
}
/**
 * Parses a credentials file of `NAME='value'` lines, as guestd writes it;
 * a missing or unreadable file is no values.
 *
 * @param path - the file
 * @returns the values by name
 */
export declare function readCredentials(path: string): Record<string, string>;
declare const sleep: (ms: number) => Promise<void>;
/**
 * A client of the strata API: an address and a key.
 *
 * Most programs never make one: {@link Sandbox.create} and the other
 * static methods use {@link Strata.default}, configured from the
 * environment. Make one to use another address or key, and pass it as
 * `client`.
 *
 * @example
 * ```ts
 * const strata = new Strata({ apiUrl: "http://127.0.0.1:8080", apiKey: process.env.MY_KEY });
 * const sb = await Sandbox.create({ client: strata });
 * ```
 */
export declare class Strata {
    /** The API's address, without a trailing slash. */
    readonly apiUrl: string;
    /** The key sent as `X-Api-Key`. */
    readonly apiKey: string;
    /** The sandbox this program runs in (or was configured for), if known. */
    readonly sandboxId: string | undefined;
    /** See {@link StrataOptions.retryTimeoutMs}. */
    readonly retryTimeoutMs: number;
    /** See {@link StrataOptions.waitTimeoutMs}. */
    readonly waitTimeoutMs: number;
    private readonly onRequest;
    private static defaultClient;
    private static defaultOptions;
    /**
     * Resolves each setting from the options, then the environment
     * (`CREATEOS_API_URL`, `CREATEOS_API_KEY`, `CREATEOS_SANDBOX_ID`), then
     * the credentials file.
     *
     * @param options - the settings; see {@link StrataOptions}
     * @throws {@link StrataError} `invalid_argument` when no address or no key is found
     */
    constructor(options?: StrataOptions);
    /**
     * The client the static methods use when given none: made at its first
     * use from {@link Strata.configure}'s options and the environment.
     *
     * @returns the default client
     */
    static default(): Strata;
    /**
     * Sets the options of the default client (which is made again at its next use).
     *
     * @param options - the settings; see {@link StrataOptions}
     */
    static configure(options: StrataOptions): void;
    /**
     * Reports a request to the `onRequest` hook.
     *
     * @internal
     */
    notify(method: string, path: string): void;
    /**
     * Calls one route and returns its JSend `data`, retried as docs/sdk.md,
     * "Retries", says (the rule all three clients follow): GET, HEAD, PUT and
     * POSTs sent with an `Idempotency-Key` (the same key on every try) after a
     * network error, a 500, 502, 503 (but `host_capacity`) or 504; any call
     * (but a streamed body) after a 429 or a refused connection, which mean
     * it was not done; each wait the answer's `Retry-After`, or 0.25 s
     * doubling to 5 s with jitter, while it ends within `retryTimeoutMs` of
     * the first failure.
     *
     * @typeParam T - the type of `data`
     * @param method - the HTTP method
     * @param path - the path, `/v1/…`, each part already escaped
     * @param options - body, query, headers; see {@link CallOptions}
     * @returns the data and the answer
     * @throws {@link StrataError} for any failure
     */
    call<T = unknown>(method: string, path: string, options?: CallOptions): Promise<CallResult<T>>;
}
/**
 * The JSend `data` of a success's body.
 *
 * @throws {@link StrataError} `http_<status>` when the body is not a JSend success
 */
export declare function dataOf<T>(method: string, path: string, response: Response, text: string): T;
/**
 * The StrataError of an answer that is no success: the JSend `fail` or
 * `error`'s code, message and other fields; `http_<status>` for an answer
 * that is not JSend (any JSON that is not a JSend object, `null` included)
 * or that names no code.
 */
export declare function errorOf(method: string, path: string, response: Response, text: string): StrataError;
/** The path of a sandbox, and of parts below it (each escaped). */
export declare function sandboxPath(id: string, ...rest: string[]): string;
/**
 * The API's records with camelCase keys (values untouched); the maps of
 * the caller's own keys (`labels`, `env`) keep theirs.
 */
export declare function camel<T>(v: unknown): T;
/** Sleeps ms milliseconds. */
export { sleep };
