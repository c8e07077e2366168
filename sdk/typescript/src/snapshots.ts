/**
 * VM snapshots: `sb.snapshots`.
 *
 * @module
 */
import { Strata, camel, sandboxPath } from "./client.js";
import { StrataError } from "./errors.js";
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
export function checkpointInfo(s: Snapshot): CheckpointInfo {
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
function createBody(o: SnapshotCreateOptions): Record<string, unknown> {
  let memory = o.memory;
  if (o.kind !== undefined) {
    if (o.kind !== "full" && o.kind !== "disk_only") throw new StrataError("invalid_argument", `kind must be "full" or "disk_only", not ${JSON.stringify(o.kind)}`);
    const m = o.kind === "full";
    if (memory !== undefined && memory !== m) throw new StrataError("invalid_argument", `memory: ${memory} and kind: "${o.kind}" say two different things`);
    memory = m;
  }
  if (o.retention && o.retentionPolicy) throw new StrataError("invalid_argument", "give retention or retentionPolicy, not both");
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
  /** @internal */
  constructor(
    private readonly client: Strata,
    private readonly sandboxId: string,
    private readonly afterRestore: () => Promise<unknown>,
  ) {}

  /**
   * Takes a snapshot; returns once it is `ready`. Not retried (the route
   * takes no `Idempotency-Key`), but on a 429.
   *
   * @param options - name, comment, memory (or `kind`), retention (or `retentionPolicy`)
   * @returns the snapshot
   * @throws {@link StrataError} `snapshot_limit`, `name_taken`, `snapshot_quota_exceeded` (409), 507
   */
  async create(options: SnapshotCreateOptions = {}): Promise<Snapshot> {
    const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "snapshots"), { json: createBody(options) });
    return camel<Snapshot>(data);
  }

  /**
   * Lists the sandbox's snapshots, oldest first.
   *
   * @returns the snapshots
   */
  async list(): Promise<Snapshot[]> {
    return camel<Snapshot[]>((await this.client.call("GET", sandboxPath(this.sandboxId, "snapshots"))).data);
  }

  /**
   * Reads one snapshot.
   *
   * @param id - `v1`, `auto-1`, …, its ref (`sn-…`) or its name
   * @returns the snapshot
   * @throws {@link StrataError} `snapshot_not_found` (404)
   */
  async get(id: string): Promise<Snapshot> {
    return camel<Snapshot>((await this.client.call("GET", sandboxPath(this.sandboxId, "snapshots", id))).data);
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
  async restore(id: string, options: { diskOnly?: boolean } = {}): Promise<SnapshotRestored> {
    const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "snapshots", id, "restore"), {
      json: options.diskOnly ? { disk_only: true } : undefined,
    });
    await this.afterRestore();
    return camel<SnapshotRestored>(data);
  }

  /**
   * Deletes a snapshot (forks made from it are unaffected).
   *
   * @param id - `v1`, …, its ref or its name
   */
  async delete(id: string): Promise<void> {
    await this.client.call("DELETE", sandboxPath(this.sandboxId, "snapshots", id));
  }

  /**
   * Pins a snapshot: retention never deletes it.
   *
   * @param id - `v1`, …, its ref or its name
   * @returns the snapshot
   */
  async pin(id: string): Promise<Snapshot> {
    return camel<Snapshot>((await this.client.call("POST", sandboxPath(this.sandboxId, "snapshots", id, "pin"))).data);
  }

  /**
   * Unpins a snapshot.
   *
   * @param id - `v1`, …, its ref or its name
   * @returns the snapshot
   */
  async unpin(id: string): Promise<Snapshot> {
    return camel<Snapshot>((await this.client.call("POST", sandboxPath(this.sandboxId, "snapshots", id, "unpin"))).data);
  }
}
