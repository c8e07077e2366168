/**
 * The TypeScript SDK of strata: sandboxes (QEMU microVMs), commands and
 * sessions, files, **directory checkpoints** (`sb.checkpoints`: one
 * directory inside a sandbox) and **VM snapshots** (`sb.snapshots`, and the
 * seeds' `sb.createCheckpoint()`: the whole sandbox) with forks.
 *
 * @example
 * ```ts
 * import { Sandbox } from "@strata/sdk";
 * const sb = await Sandbox.create();
 * console.log((await sb.exec.run("uname -a")).stdout);
 * await sb.kill();
 * ```
 *
 * @packageDocumentation
 */
export { Strata, readCredentials, DEFAULT_CREDENTIALS_FILE } from "./client.js";
export type { StrataOptions, CallOptions, CallResult } from "./client.js";
export { StrataError } from "./errors.js";
export { Sandbox } from "./sandbox.js";
export type { SandboxCreateOptions, ForkOptions, ForkSet, WaitOptions, ClientOptions, EnvAndLabels, CreateFromCheckpointOptions, CheckpointOptions, ListOptions, } from "./sandbox.js";
export { Exec, Session } from "./exec.js";
export type { RunOptions, StartOptions, AttachOptions, OutputChunk } from "./exec.js";
export { Files } from "./files.js";
export type { WriteOptions } from "./files.js";
export { Checkpoints } from "./checkpoints.js";
export type { CheckpointCreateOptions } from "./checkpoints.js";
export { Snapshots, checkpointInfo } from "./snapshots.js";
export type { SnapshotCreateOptions } from "./snapshots.js";
export { AccessTokens } from "./tokens.js";
export { Network } from "./network.js";
export { ROUTES } from "./routes.js";
export type * from "./types.js";
