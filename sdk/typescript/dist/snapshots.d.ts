/**
 * VM snapshots: `sb.snapshots`.
 *
 * @module
 */
import { Strata } from "./client.js";
import type { CheckpointInfo, Retention, Snapshot, SnapshotRestored } from "./types.js";
/** Options of {@link Snapshots.create}. */
export interface SnapshotCreateOptions {
    /** A name (at most 64 letters, digits, `.`, `_`, `-`; unique per sandbox, `409 name_taken`), accepted wherever a snapshot id is. */
    name?: string;
    /** A comment (at most 256 bytes). */
    comment?: string;
    /** Keep memory and devices, so processes come back running (default `true`); `false` keeps the disk only. */
    memory?: boolean;
    /** Delete the oldest snapshots of the same kind (neither pinned nor automatic) so that at most `maxCount` (1–100) remain with the new one. */
    retention?: Retention;
    /** OpenComputer's name for `memory`: `"full"` (the default) keeps memory, `"disk_only"` the disk alone. */
    kind?: "full" | "disk_only";
    /** OpenComputer's name for `retention` (`{ mode: "delete_oldest", maxCount }`). */
    retentionPolicy?: Retention;
}
/**
 * A snapshot record as OpenComputer's `CheckpointInfo` (`id` its ref).
 *
 * @param s - the record
 * @returns the checkpoint's info
 */
export declare function checkpointInfo(s: Snapshot): CheckpointInfo;
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
export declare class Snapshots {
    private readonly client;
    private readonly sandboxId;
    private readonly afterRestore;
    /** @internal */
    constructor(client: Strata, sandboxId: string, afterRestore: () => Promise<unknown>);
    /**
     * Takes a snapshot; returns once it is `ready`. Not retried (the route
     * takes no `Idempotency-Key`), but on a 429.
     *
     * @param options - name, comment, memory (or `kind`), retention (or `retentionPolicy`)
     * @returns the snapshot
     * @throws {@link StrataError} `snapshot_limit`, `name_taken`, `snapshot_quota_exceeded` (409), 507
     */
    create(options?: SnapshotCreateOptions): Promise<Snapshot>;
    /**
     * Lists the sandbox's snapshots, oldest first.
     *
     * @returns the snapshots
     */
    list(): Promise<Snapshot[]>;
    /**
     * Reads one snapshot.
     *
     * @param id - `v1`, `auto-1`, …, its ref (`sn-…`) or its name
     * @returns the snapshot
     * @throws {@link StrataError} `snapshot_not_found` (404)
     */
    get(id: string): Promise<Snapshot>;
    /**
     * Puts the sandbox back to a snapshot; returns once it runs again. Its
     * state before is first kept as an automatic snapshot (`autoId`).
     * Attachments of sessions end (1011) and attach again by themselves.
     *
     * @param id - `v1`, …, its ref or its name
     * @param options - `diskOnly`: restore only its disk, as a fresh boot
     * @returns the snapshot, the automatic one, and `state: "running"`
     */
    restore(id: string, options?: {
        diskOnly?: boolean;
    }): Promise<SnapshotRestored>;
    /**
     * Deletes a snapshot (forks made from it are unaffected).
     *
     * @param id - `v1`, …, its ref or its name
     */
    delete(id: string): Promise<void>;
    /**
     * Pins a snapshot: retention never deletes it.
     *
     * @param id - `v1`, …, its ref or its name
     * @returns the snapshot
     */
    pin(id: string): Promise<Snapshot>;
    /**
     * Unpins a snapshot.
     *
     * @param id - `v1`, …, its ref or its name
     * @returns the snapshot
     */
    unpin(id: string): Promise<Snapshot>;
}
