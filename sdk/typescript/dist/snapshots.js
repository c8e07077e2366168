/**
 * VM snapshots: `sb.snapshots`.
 *
 * @module
 */
import { camel, sandboxPath } from "./client.js";
import { StrataError } from "./errors.js";
/**
 * A snapshot record as OpenComputer's `CheckpointInfo` (`id` its ref).
 *
 * @param s - the record
 * @returns the checkpoint's info
 */
export function checkpointInfo(s) {
    return {
        id: s.ref ?? s.id,
        sandboxId: s.sandbox,
        name: s.name ?? "",
        status: s.status,
        sizeBytes: s.sizeBytes,
        createdAt: s.createdAt,
        snapshotId: s.id,
        kind: s.memory ? "full" : "disk_only",
        comment: s.comment,
    };
}
/**
 * The body of a snapshot create: `kind` and `retentionPolicy` are
 * OpenComputer's names of `memory` and `retention`; giving both names of
 * one setting, differently, is an `invalid_argument`.
 */
function createBody(o) {
    let memory = o.memory;
    if (o.kind !== undefined) {
        if (o.kind !== "full" && o.kind !== "disk_only")
            throw new StrataError("invalid_argument", `kind must be "full" or "disk_only", not ${JSON.stringify(o.kind)}`);
        const m = o.kind === "full";
        if (memory !== undefined && memory !== m)
            throw new StrataError("invalid_argument", `memory: ${memory} and kind: "${o.kind}" say two different things`);
        memory = m;
    }
    if (o.retention && o.retentionPolicy)
        throw new StrataError("invalid_argument", "give retention or retentionPolicy, not both");
    const r = o.retention ?? o.retentionPolicy;
    const retention = r && { mode: r.mode ?? "delete_oldest", max_count: r.maxCount };
    return { name: o.name, comment: o.comment, memory, retention };
}
/**
 * **VM snapshots** (`sb.snapshots`): the whole sandbox, its disk and by
 * default its memory, so its processes come back running; the source of
 * forks. The seeds call these "checkpoints": {@link Sandbox.createCheckpoint}
 * and its siblings are aliases of this class's methods. Directory-level
 * checkpoints are {@link Checkpoints} (`sb.checkpoints`).
 *
 * @example
 * ```ts
 * const snap = await sb.snapshots.create({ name: "after-build" });
 * const [a, b] = await sb.fork(snap.id, { count: 2 });
 * await sb.snapshots.restore("after-build");
 * ```
 */
export class Snapshots {
    client;
    sandboxId;
    afterRestore;
    /** @internal */
    constructor(client, sandboxId, afterRestore) {
        this.client = client;
        this.sandboxId = sandboxId;
        this.afterRestore = afterRestore;
    }
    /**
     * Takes a snapshot; returns once it is `ready`. Not retried (the route
     * takes no `Idempotency-Key`), but on a 429.
     *
     * @param options - name, comment, memory (or `kind`), retention (or `retentionPolicy`)
     * @returns the snapshot
     * @throws {@link StrataError} `snapshot_limit`, `name_taken`, `snapshot_quota_exceeded` (409), 507
     */
    async create(options = {}) {
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "snapshots"), { json: createBody(options) });
        return camel(data);
    }
    /**
     * Lists the sandbox's snapshots, oldest first.
     *
     * @returns the snapshots
     */
    async list() {
        return camel((await this.client.call("GET", sandboxPath(this.sandboxId, "snapshots"))).data);
    }
    /**
     * Reads one snapshot.
     *
     * @param id - `v1`, `auto-1`, …, its ref (`sn-…`) or its name
     * @returns the snapshot
     * @throws {@link StrataError} `snapshot_not_found` (404)
     */
    async get(id) {
        return camel((await this.client.call("GET", sandboxPath(this.sandboxId, "snapshots", id))).data);
    }
    /**
     * Puts the sandbox back to a snapshot; returns once it runs again. Its
     * state before is first kept as an automatic snapshot (`autoId`).
     * Attachments of sessions end (1011) and attach again by themselves.
     *
     * @param id - `v1`, …, its ref or its name
     * @param options - `diskOnly`: restore only its disk, as a fresh boot
     * @returns the snapshot, the automatic one, and `state: "running"`
     */
    async restore(id, options = {}) {
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "snapshots", id, "restore"), {
            json: options.diskOnly ? { disk_only: true } : undefined,
        });
        await this.afterRestore();
        return camel(data);
    }
    /**
     * Deletes a snapshot (forks made from it are unaffected).
     *
     * @param id - `v1`, …, its ref or its name
     */
    async delete(id) {
        await this.client.call("DELETE", sandboxPath(this.sandboxId, "snapshots", id));
    }
    /**
     * Pins a snapshot: retention never deletes it.
     *
     * @param id - `v1`, …, its ref or its name
     * @returns the snapshot
     */
    async pin(id) {
        return camel((await this.client.call("POST", sandboxPath(this.sandboxId, "snapshots", id, "pin"))).data);
    }
    /**
     * Unpins a snapshot.
     *
     * @param id - `v1`, …, its ref or its name
     * @returns the snapshot
     */
    async unpin(id) {
        return camel((await this.client.call("POST", sandboxPath(this.sandboxId, "snapshots", id, "unpin"))).data);
    }
}
//# sourceMappingURL=snapshots.js.map