/**
 * Sandboxes: {@link Sandbox}.
 *
 * @module
 */
import { Strata, camel, sandboxPath, sleep } from "./client.js";
import { StrataError } from "./errors.js";
import { Checkpoints } from "./checkpoints.js";
import { Exec } from "./exec.js";
import { Files } from "./files.js";
import { Snapshots, checkpointInfo, type SnapshotCreateOptions } from "./snapshots.js";
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

/** States on the way to another. */
const TRANSITIONAL = new Set<SandboxState>(["creating", "pausing", "resuming", "stopping", "destroying", "unresponsive"]);

/** e, with the sandbox's id added to its data (so that the caller can find, and kill, what was made). */
function naming(e: unknown, sandbox: string): unknown {
  if (!(e instanceof StrataError)) return e;
  if (e.data.sandbox === sandbox) return e;
  return new StrataError(e.code, `${e.message} (sandbox ${sandbox})`, e.status, { ...e.data, sandbox }, e.requestId, { cause: e });
}

/** Whether e is the server's refusal of the key (403 `forbidden`). */
function forbidden(e: unknown): boolean {
  return e instanceof StrataError && e.status === 403 && e.code === "forbidden";
}

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
export class Sandbox {
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
  constructor(client: Strata, info: SandboxInfo) {
    this.client = client;
    this.id = info.id;
    this.info = info;
    this.exec = new Exec(client, this.id);
    this.files = new Files(client, this.id);
    this.checkpoints = new Checkpoints(client, this.id);
    // After a restore the record is read again; a key that may not read it
    // (it may not restore either, today) does without.
    this.snapshots = new Snapshots(client, this.id, () => this.refresh().catch((e: unknown) => (forbidden(e) ? undefined : Promise.reject(e))));
    this.accessToken = new AccessTokens(client, this.id);
    this.network = new Network(client, this.id);
  }

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
  static async create(options: SandboxCreateOptions = {}): Promise<Sandbox> {
    const client = options.client ?? Strata.default();
    const { data } = await client.call("POST", "/v1/sandboxes", {
      json: {
        name: options.name,
        memory_mib: options.memoryMib,
        vcpus: options.vcpus,
        disk_gib: options.diskGib,
        access: options.access,
        env: options.env,
        labels: options.labels,
        network: options.network,
      },
      idempotent: true,
    });
    const sb = new Sandbox(client, camel<SandboxRecord>(data));
    if (options.wait !== false) await sb.waitFor("running").catch((e: unknown) => Promise.reject(naming(e, sb.id)));
    return sb;
  }

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
  static async connect(id?: string, options: ClientOptions = {}): Promise<Sandbox> {
    const client = options.client ?? Strata.default();
    const sid = id ?? client.sandboxId;
    if (!sid) throw new StrataError("invalid_argument", "no sandbox id: pass one, or set CREATEOS_SANDBOX_ID (inside a sandbox, the credentials file has it)");
    try {
      const { data } = await client.call("GET", sandboxPath(sid));
      return new Sandbox(client, camel<SandboxRecord>(data));
    } catch (e) {
      if (forbidden(e)) return new Sandbox(client, { id: sid });
      throw e;
    }
  }

  /**
   * Lists the account's sandboxes, oldest first (every page); with
   * `labels`, those that have every one of them. Their records have no
   * `env` (see {@link Sandbox.refresh}).
   *
   * @param options - labels, client
   * @returns the sandboxes
   */
  static async list(options: ListOptions = {}): Promise<Sandbox[]> {
    const client = options.client ?? Strata.default();
    const label = Object.entries(options.labels ?? {}).map(([k, v]) => `${k}=${v}`);
    const out: Sandbox[] = [];
    for (let offset = 0; ; ) {
      const { data } = await client.call<{ data: unknown[]; pagination: { total: number; count: number } }>("GET", "/v1/sandboxes", {
        query: { limit: 500, offset, label },
      });
      for (const r of camel<SandboxRecord[]>(data.data)) out.push(new Sandbox(client, r));
      offset += data.pagination.count;
      if (data.pagination.count === 0 || offset >= data.pagination.total) return out;
    }
  }

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
  static async createFromCheckpoint(
    snapshot: string | CheckpointInfo | Pick<Snapshot, "id" | "sandbox" | "ref">,
    options: CreateFromCheckpointOptions = {},
  ): Promise<Sandbox> {
    const client = options.client ?? Strata.default();
    let from: { sandbox?: string; snapshot: string };
    if (typeof snapshot === "string") {
      from = { sandbox: options.sandbox, snapshot };
      if (!options.sandbox && !/^sn-[a-z0-9]{24}$/.test(snapshot)) {
        throw new StrataError("invalid_argument", `createFromCheckpoint(${JSON.stringify(snapshot)}): an id or a name is a snapshot of one sandbox; pass { sandbox }, or the snapshot's ref (sn-…)`);
      }
    } else if ("sandboxId" in snapshot) {
      from = { snapshot: snapshot.id };
    } else {
      from = snapshot.ref ? { snapshot: snapshot.ref } : { sandbox: snapshot.sandbox, snapshot: snapshot.id };
    }
    const timeoutMs = options.timeout === undefined ? undefined : options.timeout * 1000;
    return Sandbox.forkOne(client, from, { ...options, timeoutMs });
  }

  private static async forkOne(
    client: Strata,
    from: { sandbox?: string; snapshot: string },
    options: { name?: string; access?: Access; timeoutMs?: number } & EnvAndLabels & WaitOptions,
  ): Promise<Sandbox> {
    const { data } = await client.call("POST", "/v1/sandboxes", {
      json: { name: options.name, from, access: options.access, env: options.env, labels: options.labels, network: options.network },
      idempotent: true,
    });
    const sb = new Sandbox(client, camel<SandboxRecord>(data));
    if (options.wait !== false) await sb.waitFor("running", undefined, options.timeoutMs).catch((e: unknown) => Promise.reject(naming(e, sb.id)));
    return sb;
  }

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
  fork(snapshot: string, options?: ForkOptions & { count?: undefined }): Promise<Sandbox>;
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
  fork(snapshot: string, options: ForkOptions & { count: number }): Promise<ForkSet>;
  async fork(snapshot: string, options: ForkOptions = {}): Promise<Sandbox | ForkSet> {
    if (options.count === undefined) return Sandbox.forkOne(this.client, { sandbox: this.id, snapshot }, options);
    const { data } = await this.client.call<{ sandboxes: unknown[]; failed?: ForkRefusal[] }>("POST", sandboxPath(this.id, "snapshots", snapshot, "fork"), {
      json: { count: options.count, name_prefix: options.name, access: options.access, env: options.env, labels: options.labels, network: options.network },
      idempotent: true,
    });
    const set = camel<SandboxRecord[]>(data.sandboxes).map((r) => new Sandbox(this.client, r)) as ForkSet;
    set.failed = data.failed ?? [];
    if (options.wait !== false) {
      const waits = await Promise.allSettled(set.map((s) => s.waitFor("running")));
      const bad = waits.flatMap((w, i) => (w.status === "rejected" ? [{ sandbox: set[i]!.id, error: w.reason as unknown }] : []));
      if (bad.length > 0) {
        const first = bad[0]!.error;
        const code = first instanceof StrataError ? first.code : "network_error";
        throw new StrataError(
          code,
          `${bad.length} of ${set.length} forks did not reach running (${bad.map((b) => `${b.sandbox}: ${(b.error as Error)?.message ?? b.error}`).join("; ")})`,
          first instanceof StrataError ? first.status : 0,
          {
            sandboxes: set.map((s) => s.id),
            notRunning: bad.map((b) => b.sandbox),
            errors: bad.map((b) => ({ sandbox: b.sandbox, code: b.error instanceof StrataError ? b.error.code : undefined, message: (b.error as Error)?.message ?? String(b.error) })),
            failed: set.failed,
          },
          first instanceof StrataError ? first.requestId : undefined,
          { cause: first },
        );
      }
    }
    return set;
  }

  /**
   * Reads the record again.
   *
   * @returns the record (also in {@link Sandbox.info})
   */
  async refresh(): Promise<SandboxRecord> {
    const { data } = await this.client.call("GET", sandboxPath(this.id));
    this.info = camel<SandboxRecord>(data);
    return this.info;
  }

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
  async setAccess(access: Access): Promise<SandboxRecord> {
    const { data } = await this.client.call("PUT", sandboxPath(this.id, "access"), { json: access });
    this.info = camel<SandboxRecord>(data);
    return this.info;
  }

  /**
   * Replaces the sandbox's labels (`{}` takes them all away). Needs an
   * account API key.
   *
   * @param labels - the new labels
   * @returns the record (also in {@link Sandbox.info})
   * @throws {@link StrataError} `invalid_field` (400); `sandbox_not_a_vm` (409) for a configured sandbox
   */
  async setLabels(labels: Labels): Promise<SandboxRecord> {
    const { data } = await this.client.call("PUT", sandboxPath(this.id, "labels"), { json: labels });
    this.info = camel<SandboxRecord>(data);
    return this.info;
  }

  /**
   * Deletes the sandbox: its VM, disk, checkpoints and snapshots (forks are unaffected).
   */
  async kill(): Promise<void> {
    const { data } = await this.client.call<{ state: SandboxState }>("DELETE", sandboxPath(this.id));
    this.setState(data.state);
  }

  /** Notes a state the server answered (an unread record stays unread: waitFor reads it). */
  private setState(state: SandboxState): void {
    if (this.info.state !== undefined) this.info = { ...this.info, state };
  }

  /**
   * Pauses the sandbox (its memory goes to the host's disk); returns once
   * it is `paused` unless `wait: false`.
   *
   * @param options - wait
   */
  async pause(options: WaitOptions = {}): Promise<void> {
    await this.op("pause", options.wait === false ? undefined : "paused");
  }

  /**
   * Resumes a paused sandbox; returns once it runs unless `wait: false`.
   *
   * @param options - wait
   */
  async resume(options: WaitOptions = {}): Promise<void> {
    await this.op("resume", options.wait === false ? undefined : "running");
  }

  /** Shuts the sandbox down cleanly (`stopped` when this returns). */
  async stop(): Promise<void> {
    await this.op("stop", undefined);
  }

  /**
   * Boots a stopped (or `error`) sandbox from its disk; returns once it
   * runs unless `wait: false`.
   *
   * @param options - wait
   */
  async start(options: WaitOptions = {}): Promise<void> {
    await this.op("start", options.wait === false ? undefined : "running");
  }

  private async op(name: string, want: SandboxState | undefined): Promise<void> {
    const { data } = await this.client.call<{ state: SandboxState }>("POST", sandboxPath(this.id, name));
    this.setState(data.state);
    if (want) await this.waitFor(want, name);
  }

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
  async waitFor(want: SandboxState, operation?: string, timeoutMs?: number): Promise<SandboxRecord> {
    const limit = timeoutMs ?? this.client.waitTimeoutMs;
    const deadline = Date.now() + limit;
    for (;;) {
      const info = this.info;
      let waitS: number | undefined;
      if (info.state !== undefined) {
        if (info.state === want) return info;
        if (!TRANSITIONAL.has(info.state)) {
          const last = info.lastError;
          const data = { state: info.state, sandbox: this.id, ...(info.error ? { error: info.error } : {}) };
          if (operation && last && last.operation === operation) {
            throw new StrataError(last.code || "sandbox_state", `${operation} of ${this.id} failed: ${last.message}`, 0, data);
          }
          const why = info.state === "error" && info.error ? `: ${info.error}` : "";
          throw new StrataError("sandbox_state", `sandbox ${this.id} is ${info.state}, not ${want}${why}`, 0, data);
        }
        if (Date.now() > deadline) {
          throw new StrataError("wait_timeout", `sandbox ${this.id} is still ${info.state} after ${limit} ms`, 0, { state: info.state, sandbox: this.id });
        }
        waitS = Math.max(1, Math.min(20, Math.floor((deadline - Date.now()) / 1000)));
      }
      const { data, response } = await this.client.call("GET", sandboxPath(this.id), { query: { wait_s: waitS } });
      this.info = camel<SandboxRecord>(data);
      const after = Number(response.headers.get("X-Poll-After"));
      if (this.info.state !== undefined && TRANSITIONAL.has(this.info.state) && after > 0) await sleep(after * 1000);
    }
  }

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
  async createCheckpoint(name?: string | (CheckpointOptions & { name?: string }), options: CheckpointOptions = {}): Promise<CheckpointInfo> {
    const all = typeof name === "object" && name !== null ? { ...options, ...name } : { ...options, name };
    return checkpointInfo(await this.snapshots.create(all));
  }

  /**
   * The seeds' `listCheckpoints`: the **VM snapshots**, oldest first, as {@link CheckpointInfo}.
   *
   * @returns the checkpoints
   */
  async listCheckpoints(): Promise<CheckpointInfo[]> {
    return (await this.snapshots.list()).map(checkpointInfo);
  }

  /**
   * The seeds' `restoreCheckpoint`: restores a **VM snapshot** (= `snapshots.restore(id)`).
   *
   * @param id - a {@link CheckpointInfo}'s `id` (a ref), `v1`, … or a name; or the checkpoint itself
   * @returns the restore's answer
   */
  restoreCheckpoint(id: string | Pick<CheckpointInfo, "id">): Promise<SnapshotRestored> {
    return this.snapshots.restore(typeof id === "string" ? id : id.id);
  }

  /**
   * The seeds' `deleteCheckpoint`: deletes a **VM snapshot** (= `snapshots.delete(id)`).
   *
   * @param id - a {@link CheckpointInfo}'s `id` (a ref), `v1`, … or a name; or the checkpoint itself
   */
  deleteCheckpoint(id: string | Pick<CheckpointInfo, "id">): Promise<void> {
    return this.snapshots.delete(typeof id === "string" ? id : id.id);
  }
}
