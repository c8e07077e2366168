/**
 * Directory checkpoints: `sb.checkpoints`.
 *
 * @module
 */
import { camel, sandboxPath } from "./client.js";
import { StrataError } from "./errors.js";
/** A path relative to a checkpoint's root, each segment escaped; "" for the root. */
function relPath(path) {
    const segs = path.split("/").filter((s) => s !== "" && s !== ".");
    return segs.map(encodeURIComponent).join("/");
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
export class Checkpoints {
    client;
    sandboxId;
    /** @internal */
    constructor(client, sandboxId) {
        this.client = client;
        this.sandboxId = sandboxId;
    }
    /**
     * Captures a directory.
     *
     * @param options - path, name, retention
     * @returns the checkpoint
     * @throws {@link StrataError} `directory_busy` (409, `data.holders`), `path_*` (422), …
     */
    async create(options) {
        const retention = options.retention && { mode: options.retention.mode ?? "delete_oldest", max_count: options.retention.maxCount };
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "checkpoints"), {
            json: { path: options.path, name: options.name, retention },
            idempotent: true,
        });
        return camel(data);
    }
    /**
     * Lists the sandbox's checkpoints, oldest first.
     *
     * @param options - `path`: only those of this directory (filtered here)
     * @returns the checkpoints
     */
    async list(options = {}) {
        const { data } = await this.client.call("GET", sandboxPath(this.sandboxId, "checkpoints"));
        const all = camel(data);
        return options.path === undefined ? all : all.filter((c) => c.path === options.path);
    }
    /**
     * Restores a checkpoint at its path; unsaved changes are first kept as an
     * automatic checkpoint (`safetyCheckpointId`).
     *
     * @param id - `cp_…`
     * @returns the checkpoint, its path and the safety checkpoint, if any
     */
    async restore(id) {
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "checkpoints", id, "restore"), { idempotent: true });
        return camel(data);
    }
    /**
     * Deletes a checkpoint's record (never the live directory).
     *
     * @param id - `cp_…`
     */
    async delete(id) {
        await this.client.call("DELETE", sandboxPath(this.sandboxId, "checkpoints", id));
    }
    /**
     * What a checkpoint changed against its parent, or against the live
     * directory (`against: "live"`) or another checkpoint of its directory.
     *
     * @param id - `cp_…`
     * @param options - `against`: `"live"` or a `cp_…`
     * @returns the changes, sorted by path
     */
    async changes(id, options = {}) {
        const { data } = await this.client.call("GET", sandboxPath(this.sandboxId, "checkpoints", id, "changes"), { query: { against: options.against } });
        return camel(data);
    }
    /**
     * Reads one entry of a checkpoint as it is there: a file's content
     * (base64 in `content`), a symlink's target, a directory's entries.
     *
     * @param id - `cp_…`
     * @param path - relative to the directory's root (`""` or `"."` for the root)
     * @returns the entry
     * @throws {@link StrataError} `entry_not_found` (404), `file_too_large` (413, over 4 MiB)
     */
    async entry(id, path) {
        const rel = relPath(path);
        const p = sandboxPath(this.sandboxId, "checkpoints", id, "files") + (rel ? "/" + rel : "");
        const { data } = await this.client.call("GET", p);
        return camel(data);
    }
    /**
     * Reads a file as it is in a checkpoint (files up to 4 MiB).
     *
     * @param id - `cp_…`
     * @param path - relative to the directory's root
     * @returns its bytes
     * @throws {@link StrataError} `invalid_argument` when the entry is no file
     */
    async readFile(id, path) {
        const e = await this.entry(id, path);
        if (e.type !== "file")
            throw new StrataError("invalid_argument", `${path} is a ${e.type} in ${id}, not a file`, 0, { path, type: e.type });
        return new Uint8Array(Buffer.from(e.content ?? "", "base64"));
    }
    /**
     * Lists a directory as it is in a checkpoint.
     *
     * @param id - `cp_…`
     * @param dir - relative to the directory's root (default: the root)
     * @returns names and types, sorted by name
     * @throws {@link StrataError} `invalid_argument` when the entry is no directory
     */
    async listFiles(id, dir = "") {
        const e = await this.entry(id, dir);
        if (e.type !== "dir")
            throw new StrataError("invalid_argument", `${dir} is a ${e.type} in ${id}, not a directory`, 0, { path: dir, type: e.type });
        return e.entries ?? [];
    }
    /**
     * Restores some paths of the live directory to what they are in the
     * checkpoint (removed when it lacks them); the rest is untouched.
     *
     * @param id - `cp_…`
     * @param paths - 1–100 paths relative to the directory's root
     * @returns the checkpoint, the directory, the paths, and the safety checkpoint, if any
     */
    async restorePaths(id, paths) {
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "checkpoints", id, "restore-paths"), { json: { paths } });
        return camel(data);
    }
    /**
     * Makes a new managed directory whose content is the checkpoint's,
     * sharing its layers (nothing is copied).
     *
     * @param id - `cp_…`
     * @param to - an absolute path that does not exist yet (its parent does)
     * @returns the new directory and the checkpoint it came from
     */
    async clone(id, to) {
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "checkpoints", id, "clone"), { json: { path: to } });
        return camel(data);
    }
    /**
     * Lists the managed directories and the checkpoint each continues from.
     *
     * @returns the directories
     */
    async directories() {
        const { data } = await this.client.call("GET", sandboxPath(this.sandboxId, "directories"));
        return camel(data);
    }
    /**
     * Makes a managed directory plain again, with its live content, and
     * deletes its checkpoints. It cannot be undone.
     *
     * @param path - the managed directory
     * @returns the path and the ids of the checkpoints deleted
     */
    async release(path) {
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "directories", "release"), { json: { path } });
        return camel(data);
    }
}
//# sourceMappingURL=checkpoints.js.map