/**
 * Configuration and the HTTP layer: {@link Strata}.
 *
 * @module
 */
import { readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import { StrataError } from "./errors.js";

/** The credentials file guestd writes inside a sandbox (root-readable), lines `NAME='value'`. */
export const DEFAULT_CREDENTIALS_FILE = "/run/strata/credentials.env";

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
export function readCredentials(path: string): Record<string, string> {
  const out: Record<string, string> = {};
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return out;
  }
  for (const line of text.split("\n")) {
    const t = line.trim();
    const eq = t.indexOf("=");
    if (eq <= 0 || t.startsWith("#")) continue;
    const name = t.slice(0, eq).replace(/^export\s+/, "");
    let value = t.slice(eq + 1);
    if (value.length >= 2 && value.startsWith("'") && value.endsWith("'")) value = value.slice(1, -1).replace(/'\\''/g, "'");
    out[name] = value;
  }
  return out;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** The statuses after which a retryable call is sent again (but 503 `host_capacity`): docs/sdk.md, "Retries". */
const RETRY_STATUSES = new Set([500, 502, 503, 504]);

/** Retry-After in ms (seconds or an HTTP date); undefined when absent or neither. */
function retryAfter(h: Headers): number | undefined {
  const v = h.get("Retry-After")?.trim();
  if (!v) return undefined;
  if (/^\d+(\.\d+)?$/.test(v)) return Number(v) * 1000;
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : Math.max(0, t - Date.now());
}

/** Node's fetch wraps socket errors; this finds ECONNREFUSED anywhere in the chain. */
function refused(err: unknown): boolean {
  for (let e: unknown = err, i = 0; e && i < 5; i++) {
    const code = (e as { code?: string }).code;
    if (code === "ECONNREFUSED") return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

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
export class Strata {
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
  private readonly onRequest: ((method: string, path: string) => void) | undefined;

  private static defaultClient: Strata | undefined;
  private static defaultOptions: StrataOptions = {};

  /**
   * Resolves each setting from the options, then the environment
   * (`CREATEOS_API_URL`, `CREATEOS_API_KEY`, `CREATEOS_SANDBOX_ID`), then
   * the credentials file.
   *
   * @param options - the settings; see {@link StrataOptions}
   * @throws {@link StrataError} `invalid_argument` when no address or no key is found
   */
  constructor(options: StrataOptions = {}) {
    const file = options.credentialsFile ?? process.env.CREATEOS_CREDENTIALS ?? DEFAULT_CREDENTIALS_FILE;
    let creds: Record<string, string> | undefined;
    const get = (given: string | undefined, name: string): string | undefined => {
      if (given) return given;
      const v = process.env[name];
      if (v) return v;
      creds ??= readCredentials(file);
      return creds[name] || undefined;
    };
    const url = get(options.apiUrl, "CREATEOS_API_URL");
    const key = get(options.apiKey, "CREATEOS_API_KEY");
    if (!url) throw new StrataError("invalid_argument", `no API address: set CREATEOS_API_URL or pass apiUrl (${file} has none either)`);
    if (!key) throw new StrataError("invalid_argument", `no API key: set CREATEOS_API_KEY or pass apiKey (${file} has none either)`);
    this.apiUrl = url.replace(/\/+$/, "");
    this.apiKey = key;
    this.sandboxId = get(options.sandboxId, "CREATEOS_SANDBOX_ID");
    this.retryTimeoutMs = options.retryTimeoutMs ?? 60_000;
    this.waitTimeoutMs = options.waitTimeoutMs ?? 300_000;
    this.onRequest = options.onRequest;
  }

  /**
   * The client the static methods use when given none: made at its first
   * use from {@link Strata.configure}'s options and the environment.
   *
   * @returns the default client
   */
  static default(): Strata {
    Strata.defaultClient ??= new Strata(Strata.defaultOptions);
    return Strata.defaultClient;
  }

  /**
   * Sets the options of the default client (which is made again at its next use).
   *
   * @param options - the settings; see {@link StrataOptions}
   */
  static configure(options: StrataOptions): void {
    Strata.defaultOptions = { ...options };
    Strata.defaultClient = undefined;
  }

  /**
   * Reports a request to the `onRequest` hook.
   *
   * @internal
   */
  notify(method: string, path: string): void {
    this.onRequest?.(method, path);
  }

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
  async call<T = unknown>(method: string, path: string, options: CallOptions = {}): Promise<CallResult<T>> {
    let url = this.apiUrl + path;
    if (options.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(options.query)) {
        if (Array.isArray(v)) for (const x of v) q.append(k, x);
        else if (v !== undefined) q.set(k, String(v));
      }
      const s = q.toString();
      if (s) url += (path.includes("?") ? "&" : "?") + s;
    }
    const headers: Record<string, string> = { "X-Api-Key": this.apiKey, Accept: "application/json", ...options.headers };
    let body: RequestInit["body"];
    if (options.json !== undefined) {
      body = JSON.stringify(options.json);
      headers["Content-Type"] = "application/json";
    } else if (options.body !== undefined) {
      body = options.body as RequestInit["body"];
    }
    if (options.idempotent) headers["Idempotency-Key"] = randomUUID();
    const streamed = typeof ReadableStream !== "undefined" && body instanceof ReadableStream;
    const retryable = !streamed && (method === "GET" || method === "HEAD" || method === "PUT" || !!options.idempotent);
    // The budget counts from the first failure: a first try may take the
    // call's whole timeout (longer than the budget), and is still retried.
    let deadline: number | undefined;
    let backoff = 250;
    /** The wait before the next try, or undefined when it would end past the budget. */
    const retryIn = (after: number | undefined): number | undefined => {
      const now = Date.now();
      deadline ??= now + this.retryTimeoutMs;
      const delay = after ?? backoff * (0.5 + Math.random());
      if (now + delay > deadline) return undefined;
      backoff = Math.min(backoff * 2, 5000);
      return delay;
    };
    for (;;) {
      let response: Response;
      this.onRequest?.(method, url.slice(this.apiUrl.length));
      try {
        const init: RequestInit & { duplex?: "half" } = { method, headers, body };
        if (streamed) init.duplex = "half";
        response = await fetch(url, init);
      } catch (err) {
        const delay = !streamed && (retryable || refused(err)) ? retryIn(undefined) : undefined;
        if (delay !== undefined) {
          await sleep(delay);
          continue;
        }
        throw new StrataError("network_error", `${method} ${path}: ${(err as Error).message}${refused(err) ? " (connection refused)" : ""}`, 0, {}, undefined, { cause: err });
      }
      if (response.status === 429 && !streamed) {
        const delay = retryIn(retryAfter(response.headers));
        if (delay !== undefined) {
          await response.body?.cancel();
          await sleep(delay);
          continue;
        }
      }
      if (retryable && RETRY_STATUSES.has(response.status)) {
        const text = await response.text();
        const err = errorOf(method, path, response, text);
        const delay = err.code === "host_capacity" ? undefined : retryIn(retryAfter(response.headers));
        if (delay !== undefined) {
          await sleep(delay);
          continue;
        }
        throw err;
      }
      if (options.raw && response.status < 300) return { data: undefined as T, response };
      if (method === "HEAD") {
        if (response.status < 300) return { data: undefined as T, response };
        const code = response.status === 404 ? "file_not_found" : response.status === 409 ? "not_a_file" : `http_${response.status}`;
        throw new StrataError(code, `HEAD ${path}: HTTP ${response.status}`, response.status, {}, response.headers.get("X-Request-Id") ?? undefined);
      }
      const text = await response.text();
      if (response.status >= 200 && response.status < 300) return { data: dataOf<T>(method, path, response, text), response };
      throw errorOf(method, path, response, text);
    }
  }
}

/** JSON.parse, `undefined` for text that is not JSON. */
function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** Whether v is a plain JSON object (not null, not an array). */
function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * The JSend `data` of a success's body.
 *
 * @throws {@link StrataError} `http_<status>` when the body is not a JSend success
 */
export function dataOf<T>(method: string, path: string, response: Response, text: string): T {
  const env = parseJson(text);
  if (!isObject(env) || env.status !== "success") {
    throw new StrataError(
      `http_${response.status}`,
      `${method} ${path}: HTTP ${response.status} with a body that is not JSend: ${text.slice(0, 200)}`,
      response.status,
      {},
      response.headers.get("X-Request-Id") ?? undefined,
    );
  }
  return env.data as T;
}

/**
 * The StrataError of an answer that is no success: the JSend `fail` or
 * `error`'s code, message and other fields; `http_<status>` for an answer
 * that is not JSend (any JSON that is not a JSend object, `null` included)
 * or that names no code.
 */
export function errorOf(method: string, path: string, response: Response, text: string): StrataError {
  const requestId = response.headers.get("X-Request-Id") ?? undefined;
  const env = parseJson(text);
  const fallback = `http_${response.status}`;
  if (!isObject(env) || (env.status !== "fail" && env.status !== "error")) {
    return new StrataError(fallback, `${method} ${path}: HTTP ${response.status}: ${text.slice(0, 200)}`, response.status, {}, requestId);
  }
  const data = isObject(env.data) ? env.data : {};
  const { code, message, ...rest } = data;
  const msg = typeof message === "string" ? message : typeof env.message === "string" ? env.message : `${method} ${path}: HTTP ${response.status}`;
  return new StrataError(typeof code === "string" && code ? code : fallback, msg, response.status, rest, requestId);
}

/** The path of a sandbox, and of parts below it (each escaped). */
export function sandboxPath(id: string, ...rest: string[]): string {
  return "/v1/sandboxes/" + [id, ...rest].map(encodeURIComponent).join("/");
}

/** A snake_case key as camelCase. */
function camelKey(k: string): string {
  return k.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

/**
 * The members whose value is a map of the caller's own keys (a sandbox's
 * `labels` and `env`): kept as they are, never camelCased.
 */
const OWN_KEYS = new Set(["labels", "env"]);

/**
 * The API's records with camelCase keys (values untouched); the maps of
 * the caller's own keys (`labels`, `env`) keep theirs.
 */
export function camel<T>(v: unknown): T {
  if (Array.isArray(v)) return v.map((x) => camel(x)) as T;
  if (v && typeof v === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[camelKey(k)] = OWN_KEYS.has(k) && x && typeof x === "object" ? { ...x } : camel(x);
    return out as T;
  }
  return v as T;
}

/** Sleeps ms milliseconds. */
export { sleep };
