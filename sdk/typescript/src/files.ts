/**
 * Files in and out of a running sandbox: `sb.files`.
 *
 * @module
 */
import { spawn } from "node:child_process";
import { mkdir } from "node:fs/promises";
import { Readable } from "node:stream";
import { Strata, camel, sandboxPath } from "./client.js";
import { StrataError } from "./errors.js";
import type { FileEntry, FileStat, FileWritten } from "./types.js";

/** Options of a file write. */
export interface WriteOptions {
  /** Permission bits, e.g. `0o755` (default `0o644`). */
  mode?: number;
  /** Make missing parent directories. */
  parents?: boolean;
  /** The file's modification time. */
  mtime?: Date;
}

/** The route path of an absolute path in the guest (`/` is `…/files`). */
function filesPath(sandbox: string, path: string): string {
  if (!path.startsWith("/")) throw new StrataError("invalid_argument", `a sandbox path is absolute: ${JSON.stringify(path)}`);
  const segs = path.split("/").filter((s) => s !== "");
  return sandboxPath(sandbox, "files") + (segs.length ? "/" + segs.map(encodeURIComponent).join("/") : "");
}

function writeHeaders(contentType: string, o: WriteOptions): Record<string, string> {
  const h: Record<string, string> = { "Content-Type": contentType };
  if (o.mode !== undefined) h["X-File-Mode"] = (o.mode & 0o7777).toString(8).padStart(4, "0");
  if (o.mtime) h["X-File-Mtime"] = o.mtime.toISOString();
  return h;
}

/** An async iterable of bytes as a web ReadableStream. */
function toStream(src: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  if (src instanceof ReadableStream) return src;
  const it = src[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(ctl) {
      const { value, done } = await it.next();
      if (done) ctl.close();
      else ctl.enqueue(value);
    },
    async cancel() {
      await it.return?.();
    },
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
  /** @internal */
  constructor(
    private readonly client: Strata,
    private readonly sandboxId: string,
  ) {}

  /**
   * Writes a file (created or replaced atomically once whole).
   *
   * @param path - an absolute path in the sandbox
   * @param data - the content: a string (UTF-8) or bytes
   * @param options - mode, parents, mtime
   * @returns the path and the bytes written
   */
  async write(path: string, data: string | Uint8Array | ArrayBuffer, options: WriteOptions = {}): Promise<FileWritten> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data instanceof Uint8Array ? data : new Uint8Array(data);
    const { data: out } = await this.client.call("PUT", filesPath(this.sandboxId, path), {
      body,
      headers: writeHeaders("application/octet-stream", options),
      query: { parents: options.parents ? "true" : undefined },
    });
    return camel<FileWritten>(out);
  }

  /**
   * Writes a file from a stream, never holding it whole.
   *
   * @param path - an absolute path in the sandbox
   * @param source - a web ReadableStream or any async iterable of bytes (a Node Readable is one)
   * @param options - mode, parents, mtime
   * @returns the path and the bytes written
   */
  async writeStream(path: string, source: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>, options: WriteOptions = {}): Promise<FileWritten> {
    const { data } = await this.client.call("PUT", filesPath(this.sandboxId, path), {
      body: toStream(source),
      headers: writeHeaders("application/octet-stream", options),
      query: { parents: options.parents ? "true" : undefined },
    });
    return camel<FileWritten>(data);
  }

  /**
   * Reads a whole file.
   *
   * @param path - an absolute path in the sandbox
   * @returns its bytes
   * @throws {@link StrataError} `file_not_found` (404), `not_a_file` (409)
   */
  async read(path: string): Promise<Uint8Array> {
    const res = await this.open(path);
    return new Uint8Array(await res.arrayBuffer());
  }

  /**
   * Reads a whole file as text.
   *
   * @param path - an absolute path in the sandbox
   * @returns its content, decoded as UTF-8
   */
  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.read(path));
  }

  /**
   * Reads a file as a stream.
   *
   * @param path - an absolute path in the sandbox
   * @returns its bytes, as they come
   */
  async readStream(path: string): Promise<ReadableStream<Uint8Array>> {
    const res = await this.open(path);
    return res.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
  }

  private async open(path: string): Promise<Response> {
    const p = filesPath(this.sandboxId, path);
    const { response } = await this.client.call("GET", p, { raw: true, headers: { Accept: "application/octet-stream" } });
    if (!(response.headers.get("Content-Type") ?? "").startsWith("application/octet-stream")) {
      await response.body?.cancel();
      throw new StrataError("not_a_file", `${path} is a directory`, 409, { path });
    }
    return response;
  }

  /**
   * Lists a directory.
   *
   * @param dir - an absolute path in the sandbox
   * @returns its entries
   */
  async list(dir: string): Promise<FileEntry[]> {
    const { data } = await this.client.call<{ entries: unknown[] }>("GET", filesPath(this.sandboxId, dir));
    return camel<FileEntry[]>(data.entries);
  }

  /**
   * Removes a file or an empty directory, or a whole tree with `recursive`.
   *
   * @param path - an absolute path in the sandbox
   * @param options - `recursive`: remove a directory with entries too
   * @throws {@link StrataError} `directory_not_empty` (409) without `recursive`
   */
  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.client.call("DELETE", filesPath(this.sandboxId, path), { query: { recursive: options.recursive ? "true" : undefined } });
  }

  /**
   * Tells what is at a path (a `HEAD`).
   *
   * @param path - an absolute path in the sandbox
   * @returns its type, and for a file its size, mode and mtime
   * @throws {@link StrataError} `file_not_found` (404) when nothing is there
   */
  async stat(path: string): Promise<FileStat> {
    const { response } = await this.client.call("HEAD", filesPath(this.sandboxId, path));
    const h = response.headers;
    if (!(h.get("Content-Type") ?? "").startsWith("application/octet-stream")) return { type: "dir" };
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
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof StrataError && e.status === 404) return false;
      throw e;
    }
  }

  /**
   * Copies a local directory's tree into the sandbox, as a tar made by the
   * system's `tar` and unpacked there (modes, mtimes and symlinks kept).
   *
   * @param localDir - a directory here
   * @param dir - the directory in the sandbox (made when missing)
   * @param options - `parents`: make its missing parents too
   * @returns the directory and the bytes of the files written
   */
  async upload(localDir: string, dir: string, options: { parents?: boolean } = {}): Promise<FileWritten> {
    const tar = spawn("tar", ["-C", localDir, "-cf", "-", "."], { stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    tar.stderr.on("data", (b: Buffer) => (stderr += b.toString()));
    const exited = new Promise<number>((r) => tar.on("close", (code) => r(code ?? 1)));
    let out: FileWritten;
    try {
      const { data } = await this.client.call("PUT", filesPath(this.sandboxId, dir), {
        body: Readable.toWeb(tar.stdout) as ReadableStream<Uint8Array>,
        headers: { "Content-Type": "application/x-tar" },
        query: { parents: options.parents ? "true" : undefined },
      });
      out = camel<FileWritten>(data);
    } finally {
      if (tar.exitCode === null) tar.kill();
    }
    const code = await exited;
    if (code !== 0) throw new StrataError("tar_failed", `tar -c of ${localDir} failed (${code}): ${stderr.trim()}`);
    return out;
  }

  /**
   * Copies a directory's tree out of the sandbox into a local directory
   * (made when missing), as a tar unpacked by the system's `tar`.
   *
   * @param dir - the directory in the sandbox
   * @param localDir - the directory here
   */
  async download(dir: string, localDir: string): Promise<void> {
    const { response } = await this.client.call("GET", filesPath(this.sandboxId, dir), { raw: true, headers: { Accept: "application/x-tar" } });
    if (!(response.headers.get("Content-Type") ?? "").startsWith("application/x-tar")) {
      await response.body?.cancel();
      throw new StrataError("not_a_directory", `${dir} is not a directory`, 409, { path: dir });
    }
    await mkdir(localDir, { recursive: true });
    const tar = spawn("tar", ["-C", localDir, "-xf", "-"], { stdio: ["pipe", "ignore", "pipe"] });
    let stderr = "";
    tar.stderr.on("data", (b: Buffer) => (stderr += b.toString()));
    const exited = new Promise<number>((r) => tar.on("close", (code) => r(code ?? 1)));
    const body = Readable.fromWeb(response.body as import("node:stream/web").ReadableStream<Uint8Array>);
    body.pipe(tar.stdin);
    const broke = new Promise<never>((_, rej) => body.on("error", (e) => rej(new StrataError("network_error", `the tar of ${dir} broke off: ${e.message}`, 0, {}, undefined, { cause: e }))));
    const code = await Promise.race([exited, broke]);
    if (code !== 0) throw new StrataError("tar_failed", `tar -x into ${localDir} failed (${code}): ${stderr.trim()}`);
  }
}
