/**
 * Sandboxes: {@link Sandbox}.
 *
 * @module
 */
import { Strata } from "./client.js";
import { Checkpoints } from "./checkpoints.js";
import { Exec } from "./exec.js";
import { Files } from "./files.js";
import { Snapshots, type SnapshotCreateOptions } from "./snapshots.js";
import { AccessTokens } from "./tokens.js";
import { Network } from "./network.js";
import type { NetworkSetting } from "./types.js";
import type { Access, CheckpointInfo, ForkRefusal, Labels, SandboxInfo, SandboxRecord, SandboxState, Snapshot, SnapshotRestored } from "./types.js";
/** Whether to wait for the sandbox's state. */
export interface WaitOptions {
    /** `false`: return as soon as the server accepted the operation (default `true`). */
    wait?: boolean;
}
/** Which client to use. */
export interface ClientOptions {
    /** The client (default: {@link Strata.default}). */
    client?: Strata;
}
/** A sandbox's own env and labels, given by a create or a fork (never the source's); its network (a fork without one keeps its source's). */
export interface EnvAndLabels {
    /** Its network (default `{ egress: "all" }`; a fork: its source's): see {@link Network}. */
    network?: NetworkSetting;
    /** The environment of every exec and session of the sandbox, under each call's own `env` (at most 64 entries, with a call's; names `[A-Za-z_][A-Za-z0-9_]*`; name and value at most 4 KiB). Not a secret store: `GET` shows it. */
    env?: Record<string, string>;
    /** Its labels (see {@link Labels}): {@link Sandbox.list} finds sandboxes by them. */
    labels?: Labels;
}
/** Options of {@link Sandbox.create}. */
export interface SandboxCreateOptions extends WaitOptions, ClientOptions, EnvAndLabels {
    /** 1–63 lowercase letters, digits and `-`, not starting with `sb-` (unique per account; it works wherever the id does); default: the id. */
    name?: string;
    /** Memory, MiB (128–8192; default 512). */
    memoryMib?: number;
    /** Virtual CPUs (1–4; default 1). */
    vcpus?: number;
    /** Disk, GiB (1–64; default 4). */
    diskGib?: number;
    /** What processes inside may do with the key they are handed (default `{ scopes: ["checkpoints", "snapshots"] }`). */
    access?: Access;
}
/** Options of {@link Sandbox.fork}. */
export interface ForkOptions extends WaitOptions, EnvAndLabels {
    /** The fork's name; with `count`, the prefix of the names `<name>-1` … */
    name?: string;
    /** Make this many forks in one call (1–100): an array is returned. */
    count?: number;
    /** Each fork's access setting (default `{ scopes: ["checkpoints", "snapshots"] }`; never the source's). */
    access?: Access;
}
/** Options of {@link Sandbox.createFromCheckpoint}. */
export interface CreateFromCheckpointOptions extends WaitOptions, ClientOptions, EnvAndLabels {
    /** The sandbox the snapshot is of (its id or name): needed only when the snapshot is given by its `v1`-style id or its name, not by its ref. */
    sandbox?: string;
    /** The fork's name. */
    name?: string;
    /** The fork's access setting (default `{ scopes: ["checkpoints", "snapshots"] }`; never the source's). */
    access?: Access;
    /** OpenComputer's option: how long to wait for the fork to run, in seconds (default the client's `waitTimeoutMs`). */
    timeout?: number;
}
/** Options of {@link Sandbox.createCheckpoint}: OpenComputer's (`kind`, `retentionPolicy`) and loam's (`comment`) names. */
export type CheckpointOptions = Omit<SnapshotCreateOptions, "name">;
/** Options of {@link Sandbox.list}. */
export interface ListOptions extends ClientOptions {
    /** Only the sandboxes that have every one of these labels. */
    labels?: Labels;
}
/** The forks of a many-fork call: those made, and `failed`, the refusals of the others. */
export type ForkSet = Sandbox[] & {
    /** The forks that could not be made. */
    failed: ForkRefusal[];
};
/**
 * A sandbox: a microVM with its own kernel and disk.
 *
 * Two levels of "checkpoint", named as the seeds name them:
 * - `sb.checkpoints` ({@link Checkpoints}): **directory checkpoints**, one
 *   directory inside the sandbox, captured and restored while it runs;
 * - `sb.snapshots` ({@link Snapshots}) and the seeds' `createCheckpoint`,
 *   `listCheckpoints`, `restoreCheckpoint`, `deleteCheckpoint`:
 *   **VM snapshots** of the whole sandbox (disk and memory), the source of forks.
 *
 * @example
 * ```ts
 * const sb = await Sandbox.create({ name: "demo" });
 * const r = await sb.exec.run("echo hi");
 * const cp = await sb.createCheckpoint("after-setup"); // a VM snapshot
 * const fork = await sb.fork(cp.id);
 * await fork.kill();
 * await sb.kill();
 * ```
 */
export declare class Sandbox {
    /** The sandbox's id, `sb-…`. */
    readonly id: string;
    /** The client it is reached with. */
    readonly client: Strata;
    /**
     * Its record as last seen (see {@link Sandbox.refresh}). Only its `id`
     * (the other fields `undefined`) after {@link Sandbox.connect} with a key
     * that may not read the record, such as a sandbox access token.
     */
    info: SandboxInfo;
    /** Commands: one-shot runs and sessions. */
    readonly exec: Exec;
    /** Files in and out. */
    readonly files: Files;
    /** Directory checkpoints (one directory inside the sandbox). */
    readonly checkpoints: Checkpoints;
    /** VM snapshots (the whole sandbox). */
    readonly snapshots: Snapshots;
    /** The sandbox's access token. */
    readonly accessToken: AccessTokens;
    /** Its network setting and usage ({@link Network}). */
    readonly network: Network;
    /**
     * Wraps a record; use {@link Sandbox.create} or {@link Sandbox.connect} instead.
     *
     * @param client - the client
     * @param info - the record, or `{ id }` alone
     */
    constructor(client: Strata, info: SandboxInfo);
    /**
     * Creates a sandbox and, unless `wait: false`, returns once it runs.
     * Sent with an `Idempotency-Key`, retried with it: a retry never makes a
     * second sandbox.
     *
     * @param options - name, memoryMib, vcpus, diskGib, access, env, labels, wait, client
     * @returns the sandbox
     * @throws {@link StrataError} `name_taken` (409), `host_capacity` (503); when the wait for `running`
     *   fails (see {@link Sandbox.waitFor}), its error with the sandbox's id in `data.sandbox`: the sandbox
     *   exists, and is the caller's to kill
     */
    static create(options?: SandboxCreateOptions): Promise<Sandbox>;
    /**
     * Connects to an existing sandbox. With no id: the sandbox this program
     * runs in (`CREATEOS_SANDBOX_ID`, or the credentials file).
     *
     * The record is read (`GET /v1/sandboxes/{id}`) when the key may: an
     * account API key. A sandbox access token, or a key the sandbox's
     * channel restricts, may not (403 `forbidden`): the sandbox is then
     * returned with `info` holding only its id, and everything the key may
     * do (files, sessions, checkpoints, snapshots) works as well; the record
     * can be read later with an account key.
     *
     * @param id - `sb-…` or its name; default: the client's `sandboxId`
     * @param options - client
     * @returns the sandbox, its record read when the key may read it
     * @throws {@link StrataError} `sandbox_not_found` (404); `invalid_argument` with no id to be found
     */
    static connect(id?: string, options?: ClientOptions): Promise<Sandbox>;
    /**
     * Lists the account's sandboxes, oldest first (every page); with
     * `labels`, those that have every one of them. Their records have no
     * `env` (see {@link Sandbox.refresh}).
     *
     * @param options - labels, client
     * @returns the sandboxes
     */
    static list(options?: ListOptions): Promise<Sandbox[]>;
    /**
     * Makes a new sandbox from a VM snapshot (a fork), as the seeds'
     * `Sandbox.createFromCheckpoint(cp.id)`: a snapshot's ref (`sn-…`, the
     * `id` of a {@link CheckpointInfo}) names it on the whole deployment; its
     * `v1`-style id or its name need `sandbox`.
     *
     * @param snapshot - a ref, a {@link CheckpointInfo} or snapshot record, or an id or name with `sandbox`
     * @param options - sandbox, name, env, labels, access, timeout (seconds), wait, client
     * @returns the fork, running unless `wait: false`
     * @throws {@link StrataError} `snapshot_not_found` (404), `invalid_argument` for an id or name without `sandbox`
     */
    static createFromCheckpoint(snapshot: string | CheckpointInfo | Pick<Snapshot, "id" | "sandbox" | "ref">, options?: CreateFromCheckpointOptions): Promise<Sandbox>;
    private static forkOne;
    /**
     * Forks this sandbox from one of its VM snapshots: one fork (a Sandbox),
     * or with `count` that many in one call (an array, with `failed` for the
     * refusals). Each returns once running unless `wait: false`. Sent with an
     * `Idempotency-Key`, retried with it: a retry never makes a fork twice.
     *
     * @param snapshot - `v1`, …, its ref (`sn-…`: a {@link CheckpointInfo}'s `id`) or its name
     * @param options - name (with count: the names' prefix), count, env, labels, access, wait
     * @returns the fork, or the forks
     */
    fork(snapshot: string, options?: ForkOptions & {
        count?: undefined;
    }): Promise<Sandbox>;
    /**
     * Forks this sandbox `count` times from one of its VM snapshots.
     *
     * @param snapshot - `v1`, …, its ref or its name
     * @param options - count, name (the names' prefix), env, labels, access, wait
     * @returns the forks made, and `failed`
     * @throws {@link StrataError} when the wait of any fork fails: the first failure's code, with
     *   `data.sandboxes` the ids of every fork made (running or not: the caller's to kill),
     *   `data.notRunning` those whose wait failed, `data.errors` their errors, `data.failed` the refusals
     */
    fork(snapshot: string, options: ForkOptions & {
        count: number;
    }): Promise<ForkSet>;
    /**
     * Reads the record again.
     *
     * @returns the record (also in {@link Sandbox.info})
     */
    refresh(): Promise<SandboxRecord>;
    /**
     * Sets what processes inside the sandbox may do with the key they are
     * handed (its channel key): `{ scopes: [...] }`, or `"none"` for no key
     * at all (every call from inside is then refused, whatever key it
     * carries). It holds from the next call on, for the key already in the
     * guest too. Needs an account API key.
     *
     * @param access - the new setting
     * @returns the record (also in {@link Sandbox.info})
     * @throws {@link StrataError} `invalid_field` (400); `sandbox_not_a_vm` (409) for a configured sandbox
     */
    setAccess(access: Access): Promise<SandboxRecord>;
    /**
     * Replaces the sandbox's labels (`{}` takes them all away). Needs an
     * account API key.
     *
     * @param labels - the new labels
     * @returns the record (also in {@link Sandbox.info})
     * @throws {@link StrataError} `invalid_field` (400); `sandbox_not_a_vm` (409) for a configured sandbox
     */
    setLabels(labels: Labels): Promise<SandboxRecord>;
    /**
     * Deletes the sandbox: its VM, disk, checkpoints and snapshots (forks are unaffected).
     */
    kill(): Promise<void>;
    /** Notes a state the server answered (an unread record stays unread: waitFor reads it). */
    private setState;
    /**
     * Pauses the sandbox (its memory goes to the host's disk); returns once
     * it is `paused` unless `wait: false`.
     *
     * @param options - wait
     */
    pause(options?: WaitOptions): Promise<void>;
    /**
     * Resumes a paused sandbox; returns once it runs unless `wait: false`.
     *
     * @param options - wait
     */
    resume(options?: WaitOptions): Promise<void>;
    /** Shuts the sandbox down cleanly (`stopped` when this returns). */
    stop(): Promise<void>;
    /**
     * Boots a stopped (or `error`) sandbox from its disk; returns once it
     * runs unless `wait: false`.
     *
     * @param options - wait
     */
    start(options?: WaitOptions): Promise<void>;
    private op;
    /**
     * Waits until the sandbox is in a state: polls its record (a long poll,
     * `?wait_s=`), honouring `X-Poll-After`. An unread record (see
     * {@link Sandbox.info}) is read first.
     *
     * @param want - the state to wait for
     * @param operation - the operation waited for, to tell its failure (`lastError`)
     * @param timeoutMs - how long to wait (default the client's `waitTimeoutMs`)
     * @returns the record
     * @throws {@link StrataError} when the sandbox settles in another state: the failed operation's
     *   code from the record's `lastError` when there is one, else the server's `sandbox_state`
     *   (`data.state`, and in state `error` `data.error`); `wait_timeout` when `waitTimeoutMs` ran out
     */
    waitFor(want: SandboxState, operation?: string, timeoutMs?: number): Promise<SandboxRecord>;
    /**
     * The seeds' `createCheckpoint`: a **VM snapshot** (= `snapshots.create`),
     * returned as OpenComputer's {@link CheckpointInfo} (`id` is its ref).
     * OpenComputer's shape, `createCheckpoint(name, { kind, retentionPolicy })`,
     * and loam's, `createCheckpoint({ comment })`, both work. Directory
     * checkpoints are `sb.checkpoints.create`.
     *
     * @example
     * ```ts
     * const cp = await sb.createCheckpoint("autosave", { kind: "disk_only", retentionPolicy: { mode: "delete_oldest", maxCount: 100 } });
     * const fork = await Sandbox.createFromCheckpoint(cp.id);
     * ```
     *
     * @param name - its name (unique per sandbox), or none; or the options alone (loam's shape)
     * @param options - kind (or memory), retentionPolicy (or retention), comment
     * @returns the checkpoint, `ready`
     */
    createCheckpoint(name?: string | (CheckpointOptions & {
        name?: string;
    }), options?: CheckpointOptions): Promise<CheckpointInfo>;
    /**
     * The seeds' `listCheckpoints`: the **VM snapshots**, oldest first, as {@link CheckpointInfo}.
     *
     * @returns the checkpoints
     */
    listCheckpoints(): Promise<CheckpointInfo[]>;
    /**
     * The seeds' `restoreCheckpoint`: restores a **VM snapshot** (= `snapshots.restore(id)`).
     *
     * @param id - a {@link CheckpointInfo}'s `id` (a ref), `v1`, … or a name; or the checkpoint itself
     * @returns the restore's answer
     */
    restoreCheckpoint(id: string | Pick<CheckpointInfo, "id">): Promise<SnapshotRestored>;
    /**
     * The seeds' `deleteCheckpoint`: deletes a **VM snapshot** (= `snapshots.delete(id)`).
     *
     * @param id - a {@link CheckpointInfo}'s `id` (a ref), `v1`, … or a name; or the checkpoint itself
     */
    deleteCheckpoint(id: string | Pick<CheckpointInfo, "id">): Promise<void>;
}
