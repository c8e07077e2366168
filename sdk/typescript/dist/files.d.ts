import { Strata } from "./client.js";
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
export declare class Files {
    private readonly client;
    private readonly sandboxId;
    /** @internal */
    constructor(client: Strata, sandboxId: string);
    /**
     * Writes a file (created or replaced atomically once whole).
     *
     * @param path - an absolute path in the sandbox
     * @param data - the content: a string (UTF-8) or bytes
     * @param options - mode, parents, mtime
     * @returns the path and the bytes written
     */
    write(path: string, data: string | Uint8Array | ArrayBuffer, options?: WriteOptions): Promise<FileWritten>;
    /**
     * Writes a file from a stream, never holding it whole.
     *
     * @param path - an absolute path in the sandbox
     * @param source - a web ReadableStream or any async iterable of bytes (a Node Readable is one)
     * @param options - mode, parents, mtime
     * @returns the path and the bytes written
     */
    writeStream(path: string, source: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>, options?: WriteOptions): Promise<FileWritten>;
    /**
     * Reads a whole file.
     *
     * @param path - an absolute path in the sandbox
     * @returns its bytes
     * @throws {@link StrataError} `file_not_found` (404), `not_a_file` (409: not a regular file); `invalid_argument` for a directory
     */
    read(path: string): Promise<Uint8Array>;
    /**
     * Reads a whole file as text.
     *
     * @param path - an absolute path in the sandbox
     * @returns its content, decoded as UTF-8
     */
    readText(path: string): Promise<string>;
    /**
     * Reads a file as a stream.
     *
     * @param path - an absolute path in the sandbox
     * @returns its bytes, as they come
     */
    readStream(path: string): Promise<ReadableStream<Uint8Array>>;
    private open;
    /**
     * Lists a directory. A file's path is refused as soon as the answer's
     * headers tell it is a file (its content is not read).
     *
     * @param dir - an absolute path in the sandbox
     * @returns its entries
     * @throws {@link StrataError} `file_not_found` (404); `invalid_argument` when `dir` is a file
     */
    list(dir: string): Promise<FileEntry[]>;
    /**
     * Removes a file or an empty directory, or a whole tree with `recursive`.
     *
     * @param path - an absolute path in the sandbox
     * @param options - `recursive`: remove a directory with entries too
     * @throws {@link StrataError} `directory_not_empty` (409) without `recursive`
     */
    remove(path: string, options?: {
        recursive?: boolean;
    }): Promise<void>;
    /**
     * Tells what is at a path (a `HEAD`).
     *
     * @param path - an absolute path in the sandbox
     * @returns its type, and for a file its size, mode and mtime
     * @throws {@link StrataError} `file_not_found` (404) when nothing is there
     */
    stat(path: string): Promise<FileStat>;
    /**
     * Tells whether something is at a path.
     *
     * @param path - an absolute path in the sandbox
     * @returns false when `stat` would say `file_not_found`
     */
    exists(path: string): Promise<boolean>;
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
    upload(localDir: string, dir: string, options?: {
        parents?: boolean;
    }): Promise<FileWritten>;
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
    download(dir: string, localDir: string): Promise<void>;
}
