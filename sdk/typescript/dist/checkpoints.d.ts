/**
 * Directory checkpoints: `sb.checkpoints`.
 *
 * @module
 */
import { Strata } from "./client.js";
import type { Change, Checkpoint, CheckpointEntry, CheckpointRestored, CloneResult, DirEntry, Directory, PathsRestored, ReleaseResult, Retention } from "./types.js";
/** Options of {@link Checkpoints.create}. */
export interface CheckpointCreateOptions {
    /** The directory's absolute path (its first capture makes it a managed directory). */
    path: string;
    /** A display name (not unique; at most 128 bytes). */
    name?: string;
    /** Delete the directory's oldest checkpoints so that at most `maxCount` (1–10,000) remain with the new one. */
    retention?: Retention;
}
/**
 * **Directory checkpoints**: copy-on-write captures of one directory
 * inside the sandbox (`sb.checkpoints`), restored in place in
 * milliseconds while the sandbox runs. These are not the VM-level
 * snapshots that the seeds' `createCheckpoint()` makes: those are
 * {@link Snapshots} (`sb.snapshots`, `sb.createCheckpoint`).
 *
 * Create and restore are sent with an `Idempotency-Key` and retried with
 * it on network errors and 5xx: a retry never makes a second checkpoint.
 *
 * @example
 * ```ts
 * const cp = await sb.checkpoints.create({ path: "/workspace/app", name: "before-update" });
 * await sb.exec.run("rm -rf /workspace/app/src");
 * await sb.checkpoints.restore(cp.id);
 * ```
 */
export declare class Checkpoints {
    private readonly client;
    private readonly sandboxId;
    /** @internal */
    constructor(client: Strata, sandboxId: string);
    /**
     * Captures a directory.
     *
     * @param options - path, name, retention
     * @returns the checkpoint
     * @throws {@link StrataError} `directory_busy` (409, `data.holders`), `path_*` (422), …
     */
    create(options: CheckpointCreateOptions): Promise<Checkpoint>;
    /**
     * Lists the sandbox's checkpoints, oldest first.
     *
     * @param options - `path`: only those of this directory (filtered here)
     * @returns the checkpoints
     */
    list(options?: {
        path?: string;
    }): Promise<Checkpoint[]>;
    /**
     * Restores a checkpoint at its path; unsaved changes are first kept as an
     * automatic checkpoint (`safetyCheckpointId`).
     *
     * @param id - `cp_…`
     * @returns the checkpoint, its path and the safety checkpoint, if any
     */
    restore(id: string): Promise<CheckpointRestored>;
    /**
     * Deletes a checkpoint's record (never the live directory).
     *
     * @param id - `cp_…`
     */
    delete(id: string): Promise<void>;
    /**
     * What a checkpoint changed against its parent, or against the live
     * directory (`against: "live"`) or another checkpoint of its directory.
     *
     * @param id - `cp_…`
     * @param options - `against`: `"live"` or a `cp_…`
     * @returns the changes, sorted by path
     */
    changes(id: string, options?: {
        against?: string;
    }): Promise<Change[]>;
    /**
     * Reads one entry of a checkpoint as it is there: a file's content
     * (base64 in `content`), a symlink's target, a directory's entries.
     *
     * @param id - `cp_…`
     * @param path - relative to the directory's root (`""` or `"."` for the root)
     * @returns the entry
     * @throws {@link StrataError} `entry_not_found` (404), `file_too_large` (413, over 4 MiB)
     */
    entry(id: string, path: string): Promise<CheckpointEntry>;
    /**
     * Reads a file as it is in a checkpoint (files up to 4 MiB).
     *
     * @param id - `cp_…`
     * @param path - relative to the directory's root
     * @returns its bytes
     * @throws {@link StrataError} `invalid_argument` when the entry is no file
     */
    readFile(id: string, path: string): Promise<Uint8Array>;
    /**
     * Lists a directory as it is in a checkpoint.
     *
     * @param id - `cp_…`
     * @param dir - relative to the directory's root (default: the root)
     * @returns names and types, sorted by name
     * @throws {@link StrataError} `invalid_argument` when the entry is no directory
     */
    listFiles(id: string, dir?: string): Promise<DirEntry[]>;
    /**
     * Restores some paths of the live directory to what they are in the
     * checkpoint (removed when it lacks them); the rest is untouched.
     *
     * @param id - `cp_…`
     * @param paths - 1–100 paths relative to the directory's root
     * @returns the checkpoint, the directory, the paths, and the safety checkpoint, if any
     */
    restorePaths(id: string, paths: string[]): Promise<PathsRestored>;
    /**
     * Makes a new managed directory whose content is the checkpoint's,
     * sharing its layers (nothing is copied).
     *
     * @param id - `cp_…`
     * @param to - an absolute path that does not exist yet (its parent does)
     * @returns the new directory and the checkpoint it came from
     */
    clone(id: string, to: string): Promise<CloneResult>;
    /**
     * Lists the managed directories and the checkpoint each continues from.
     *
     * @returns the directories
     */
    directories(): Promise<Directory[]>;
    /**
     * Makes a managed directory plain again, with its live content, and
     * deletes its checkpoints. It cannot be undone.
     *
     * @param path - the managed directory
     * @returns the path and the ids of the checkpoints deleted
     */
    release(path: string): Promise<ReleaseResult>;
}
