/**
 * The records of the API, with camelCase keys.
 *
 * @module
 */

/** The states of a sandbox. */
export type SandboxState =
  | "creating"
  | "running"
  | "unresponsive"
  | "pausing"
  | "paused"
  | "resuming"
  | "stopping"
  | "stopped"
  | "error"
  | "destroying"
  | "destroyed";

/**
 * What a sandbox access token or a channel key may do on its sandbox:
 * `checkpoints` (directory checkpoints), `snapshots` (take, list, read VM
 * snapshots), `exec` (exec and sessions), `files`, `ports`, `watch`.
 */
export type Scope = "checkpoints" | "snapshots" | "exec" | "files" | "ports" | "watch";

/**
 * A sandbox's access setting: what the processes inside it may do with the
 * key they are handed (its channel key), or `"none"`: no key at all, and
 * every call from inside refused. Default `{ scopes: ["checkpoints", "snapshots"] }`.
 */
export type Access =
  | "none"
  | {
      /** The scopes of the key handed to the guest. */
      scopes: Scope[];
    };

/** An operation answered `202` that failed afterwards (a pause whose save failed: the sandbox runs on). */
export interface FailedOperation {
  /** The operation, e.g. `"pause"`. */
  operation: string;
  /** Its stable code, when classified. */
  code?: string;
  /** What went wrong. */
  message: string;
  /** When, RFC 3339. */
  at: string;
}

/** A sandbox (a microVM) as the API shows it. */
export interface SandboxRecord {
  /** `sb-` and 24 lowercase letters and digits. */
  id: string;
  /** Its name (the guest's host name): the id when none was given. */
  name: string;
  /** Its state. */
  state: SandboxState;
  /** Memory, MiB. */
  memoryMib: number;
  /** Virtual CPUs. */
  vcpus: number;
  /** Disk, GiB. */
  diskGib: number;
  /** When it was made, RFC 3339. */
  createdAt: string;
  /** In state `error`: why. */
  error?: string;
  /** A fork: the sandbox and snapshot it was made from. */
  from?: SandboxOrigin;
  /** An operation answered `202` that failed afterwards, until the same operation succeeds. */
  lastError?: FailedOperation;
  /** In state `unresponsive`: since when. */
  unresponsiveSince?: string;
  /** In state `unresponsive`: why, when the host knows. */
  unresponsiveReason?: string;
  /** A microVM's access setting (a configured sandbox has none). */
  access?: Access;
  /** Its labels (`{}` when none; absent from servers before labels). */
  labels?: Labels;
  /** The environment of every exec and session, under each call's own `env`: in a create's answer and a read of the sandbox, never in lists. */
  env?: Record<string, string>;
  /** A microVM's network setting (lists show its `egress` alone), with its usage while it runs. */
  network?: NetworkInfo;
}

/**
 * A sandbox's network setting: `egress` `"all"` (default), `"none"` or
 * `"list"`; `allow` (with `"list"`) and `deny` rules: host names
 * (`pypi.org`), wildcards (`*.github.com`: any name below, not the name
 * itself) or CIDRs; at most 256 per list; `deny` wins.
 */
export interface NetworkSetting {
  /** Where it reaches: `"all"` (default), `"none"` or `"list"`. */
  egress?: "all" | "none" | "list";
  /** With `"list"`: what it may reach. */
  allow?: string[];
  /** What it may never reach, over `allow`. */
  deny?: string[];
}

/** A sandbox's traffic since its machine last started. */
export interface NetworkUsage {
  /** Bytes the guest sent through its connections. */
  bytesOut: number;
  /** Bytes that came back to it. */
  bytesIn: number;
  /** TCP connections carried. */
  connections: number;
  /** Connections and DNS questions refused. */
  refused: number;
}

/** A sandbox's network setting in its canonical form, with its usage while it runs. */
export interface NetworkInfo extends NetworkSetting {
  /** Where it reaches. */
  egress: "all" | "none" | "list";
  /** Its traffic since the machine last started, while it runs. */
  usage?: NetworkUsage;
}

/**
 * A sandbox's labels: at most 32; keys of 1–63 lowercase letters, digits,
 * `.`, `_`, `/` and `-`, starting and ending with a letter or digit;
 * values of at most 256 bytes of printable UTF-8.
 */
export type Labels = Record<string, string>;

/**
 * The record of a sandbox whose record this key may not read: its `id`
 * only, every other field `undefined`. {@link Sandbox.connect} gives it
 * when the server refuses the record (403 `forbidden`: a sandbox access
 * token, or a key the sandbox's channel restricts); a later
 * {@link Sandbox.refresh} with an account key reads the whole record.
 */
export type UnreadSandboxRecord = Pick<SandboxRecord, "id"> & Partial<Record<Exclude<keyof SandboxRecord, "id">, undefined>>;

/** A sandbox's record as a {@link Sandbox} holds it: read, or only its id (test `state !== undefined`). */
export type SandboxInfo = SandboxRecord | UnreadSandboxRecord;

/** Retention of a create: `delete_oldest` deletes the oldest eligible records so that at most `maxCount` remain with the new one. */
export interface Retention {
  /** The only mode: `"delete_oldest"` (the default here). */
  mode?: "delete_oldest";
  /** How many to keep with the new one: 1–10,000 for directory checkpoints, 1–100 for VM snapshots. */
  maxCount: number;
}

/** A directory checkpoint (of one directory inside the sandbox). */
export interface Checkpoint {
  /** `cp_` and 22 characters of base64url. */
  id: string;
  /** The directory. */
  path: string;
  /** The display name (`""` when none). */
  name: string;
  /** RFC 3339, UTC, milliseconds. */
  createdAt: string;
  /** The checkpoint the directory's history continues from; absent on a directory's first capture. */
  parentId?: string;
  /** `true` for one the store made itself (a restore's safety checkpoint). */
  auto: boolean;
  /** Bytes held by this checkpoint's own layer. */
  sizeBytes: number;
}

/** The answer of a directory checkpoint restore. */
export interface CheckpointRestored {
  /** The checkpoint restored. */
  checkpointId: string;
  /** Its directory. */
  path: string;
  /** The automatic checkpoint that kept the unsaved changes, when there were any. */
  safetyCheckpointId?: string;
}

/** The answer of a restore of some paths of a checkpoint. */
export interface PathsRestored extends CheckpointRestored {
  /** The paths restored, relative to the directory. */
  paths: string[];
}

/** One change between two states of a managed directory. */
export interface Change {
  /** Relative to the directory's root (`"."` is the root). */
  path: string;
  /** What happened to it. */
  change: "added" | "modified" | "deleted";
  /** Its type in the newer state (the older for a deletion). */
  type: "file" | "dir" | "symlink";
  /** Its size in bytes in that state. */
  size: number;
}

/** One entry of a checkpoint, as read from its layers. */
export interface CheckpointEntry {
  /** The path asked for (`"."` for the root). */
  path: string;
  /** Its type. */
  type: "file" | "dir" | "symlink";
  /** Permission bits as four octal digits, e.g. `"0644"`. */
  mode: string;
  /** Bytes. */
  size: number;
  /** Modification time, RFC 3339 with nanoseconds. */
  mtime: string;
  /** Files: the bytes, base64. */
  content?: string;
  /** Symlinks: the target. */
  target?: string;
  /** Directories: names and types, sorted by name. */
  entries?: DirEntry[];
}

/** A managed directory. */
export interface Directory {
  /** Its path. */
  path: string;
  /** The checkpoint its live content continues from. */
  checkpointId?: string;
  /** `ready`, `moved` or `unavailable`. */
  state: string;
  /** Moved: where its live mount is, when known. */
  nowAt?: string;
  /** Unavailable: why. */
  problem?: string;
  /** Bytes held by its layers. */
  sizeBytes: number;
}

/** A VM snapshot (the whole sandbox: disk, and memory by default). */
export interface Snapshot {
  /** `v1`, `v2`, … or `auto-1`, … per sandbox. */
  id: string;
  /** `sn-` and 24 lowercase letters and digits: the snapshot's name on the whole deployment, accepted wherever its id is and alone by {@link Sandbox.createFromCheckpoint}. */
  ref?: string;
  /** Its name, when given (unique per sandbox; accepted wherever an id is). */
  name?: string;
  /** The sandbox it is of. */
  sandbox: string;
  /** The comment given. */
  comment: string;
  /** Whether it keeps memory (processes come back running). */
  memory: boolean;
  /** Made by a restore (`auto-N`). */
  auto: boolean;
  /** Retention never deletes a pinned snapshot. */
  pinned: boolean;
  /** `processing`, `ready` or `failed`. */
  status: "processing" | "ready" | "failed";
  /** What it holds of its own on the host. */
  sizeBytes: number;
  /** RFC 3339. */
  createdAt: string;
  /** How long the guest was stopped, ms (memory snapshots of a running sandbox). */
  pauseMs?: number;
  /** Its memory was copied while the guest ran. */
  live?: boolean;
}

/**
 * A VM snapshot as OpenComputer's `CheckpointInfo` shows a checkpoint: what
 * the seeds' calls ({@link Sandbox.createCheckpoint},
 * {@link Sandbox.listCheckpoints}) return. `id` is the snapshot's ref, so
 * that `Sandbox.createFromCheckpoint(cp.id)` and `sb.restoreCheckpoint(cp.id)`
 * need nothing else.
 */
export interface CheckpointInfo {
  /** The snapshot's ref (`sn-…`): unique on the deployment. */
  id: string;
  /** The sandbox it is of. */
  sandboxId: string;
  /** Its name (`""` when none). */
  name: string;
  /** `processing`, `ready` or `failed`. */
  status: "processing" | "ready" | "failed";
  /** What it holds of its own on the host, in bytes. */
  sizeBytes: number;
  /** RFC 3339. */
  createdAt: string;
  /** Its id in its sandbox (`v1`, `auto-1`, …), for `sb.snapshots`. */
  snapshotId: string;
  /** `full` (memory, devices and disk) or `disk_only`, as OpenComputer's `kind`. */
  kind: "full" | "disk_only";
  /** The comment given (loam's `comment`; `""` when none). */
  comment: string;
}

/** The answer of a VM snapshot restore. */
export interface SnapshotRestored {
  /** The snapshot restored. */
  snapshotId: string;
  /** The automatic snapshot of the state before. */
  autoId: string;
  /** `running`. */
  state: string;
}

/** A fork that could not be made, in a many-fork call. */
export interface ForkRefusal {
  /** The stable code. */
  code: string;
  /** Why. */
  message: string;
}

/** The result of a one-shot exec. */
export interface ExecResult {
  /** The program's status; `128+N` when signal N ended it; `-1` when the timeout did. */
  exitCode: number;
  /** Standard output (its first 1 MiB). */
  stdout: string;
  /** Standard error (its first 1 MiB). */
  stderr: string;
  /** The timeout killed it. */
  timedOut: boolean;
  /** A stream was cut at 1 MiB. */
  truncated: boolean;
  /** How long it ran. */
  durationMs: number;
}

/** An exec session as the API shows it. */
export interface SessionRecord {
  /** `se-` and 16 hex digits. */
  id: string;
  /** Its sandbox. */
  sandbox: string;
  /** The command. */
  cmd: string[];
  /** Runs on a terminal. */
  tty: boolean;
  /** Carries on when its attachments close. */
  detachable: boolean;
  /** `running` or `exited`. */
  state: "running" | "exited";
  /** Once exited: its status (`-1` when its timeout killed it). */
  exitCode?: number;
  /** Once exited: whether its timeout killed it. */
  timedOut?: boolean;
  /** Attachments open now. */
  attached: number;
  /** RFC 3339. */
  createdAt: string;
  /** RFC 3339, once exited. */
  endedAt?: string;
  /** Bytes of output so far. */
  outputBytes: number;
  /**
   * The guest's generation: the run of the sandbox's memory this record's
   * offsets are of (a restore, a fork or a resume draws a new one; see
   * {@link Session}). Absent from a server that predates generations.
   */
  generation?: string;
}

/** One entry of a directory listing of the files routes. */
export interface FileEntry {
  /** Its name. */
  name: string;
  /** `file`, `dir`, `symlink` or `other`. */
  type: "file" | "dir" | "symlink" | "other";
  /** Bytes. */
  sizeBytes: number;
  /** Permission bits, octal digits. */
  mode: string;
  /** RFC 3339. */
  mtime: string;
  /** Symlinks: the target. */
  target?: string;
}

/** The answer of a file or tar write. */
export interface FileWritten {
  /** The path written. */
  path: string;
  /** Bytes written. */
  sizeBytes: number;
}

/** What a HEAD of the files routes tells. */
export interface FileStat {
  /** `file`, or `dir` for a directory. */
  type: "file" | "dir";
  /** Bytes (files). */
  size?: number;
  /** Permission bits (files), e.g. `0o644`. */
  mode?: number;
  /** Modification time (files). */
  mtime?: Date;
}

/** A sandbox access token: the plaintext only from issue and rotate. */
export interface AccessToken {
  /** `sbt_…`: only in the answers of issue and rotate. */
  token?: string;
  /** From get: whether one is enabled. */
  enabled?: boolean;
  /** Its last four characters. */
  hint?: string;
  /** RFC 3339. */
  createdAt?: string;
  /** What it may do on its sandbox. */
  scopes?: Scope[];
}

/** Where a fork came from. */
export interface SandboxOrigin {
  /** The sandbox the snapshot is of. */
  sandbox: string;
  /** The snapshot's id. */
  snapshot: string;
}

/** A name in a directory of a checkpoint. */
export interface DirEntry {
  /** The entry's name. */
  name: string;
  /** `file`, `dir` or `symlink`. */
  type: string;
}

/** The answer of a clone of a checkpoint. */
export interface CloneResult {
  /** The new managed directory. */
  path: string;
  /** The checkpoint it was made from. */
  fromCheckpointId: string;
}

/** The answer of a release of a managed directory. */
export interface ReleaseResult {
  /** The directory, now plain. */
  path: string;
  /** The checkpoints deleted with it. */
  deletedCheckpointIds: string[];
}

/** A session's whole output and exit code. */
export interface SessionOutput {
  /** Standard output, UTF-8. */
  stdout: string;
  /** Standard error, UTF-8. */
  stderr: string;
  /** The exit code. */
  exitCode: number;
}
