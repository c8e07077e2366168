/**
 * Commands: the one-shot exec and exec sessions ({@link Session}).
 *
 * @module
 */
import { Strata } from "./client.js";
import type { ExecResult, SessionOutput, SessionRecord } from "./types.js";
/** Options of {@link Exec.run}. */
export interface RunOptions {
    /** Working directory (absolute); default `/`. */
    cwd?: string;
    /** Variables added to the environment. */
    env?: Record<string, string>;
    /** Standard input (at most 1 MiB). */
    stdin?: string;
    /** Seconds before every process of the command is killed (1–3600; default 60). */
    timeoutS?: number;
}
/** Options of {@link Exec.start}. */
export interface StartOptions {
    /** Working directory (absolute); default `/`. */
    cwd?: string;
    /** Variables added to the environment. */
    env?: Record<string, string>;
    /** Run on a terminal (its output all comes as `stdout`). */
    tty?: boolean;
    /** Terminal rows (with `tty`; default 24). */
    rows?: number;
    /** Terminal columns (with `tty`; default 80). */
    cols?: number;
    /** The session carries on when its attachments close (else it gets SIGHUP when its last one does). */
    detachable?: boolean;
    /** Seconds before the session is killed (1–3600; default none). */
    timeoutS?: number;
}
/** Options of {@link Exec.attach}. */
export interface AttachOptions {
    /** The output offset to start from (bytes of stdout and stderr already seen); default 0: all the session still holds. */
    since?: number;
}
/** One chunk of a session's output. */
export interface OutputChunk {
    /** Which stream (everything is `stdout` on a terminal). */
    stream: "stdout" | "stderr";
    /** Its bytes. */
    data: Uint8Array;
}
/**
 * Commands in a sandbox: `sb.exec`.
 *
 * @example
 * ```ts
 * const r = await sb.exec.run("npm test", { cwd: "/app", timeoutS: 600 });
 * if (r.exitCode !== 0) console.error(r.stderr);
 * ```
 */
export declare class Exec {
    private readonly client;
    private readonly sandboxId;
    /** @internal */
    constructor(client: Strata, sandboxId: string);
    /**
     * Runs a command to its end (`POST …/exec`) and returns its result; a
     * non-zero exit is a result, not an error. Its output is kept up to 1 MiB
     * per stream. Node's fetch gives up on an answer after 300 s: use
     * {@link Exec.start} for longer commands.
     *
     * @param cmd - a string runs with `["sh", "-c", cmd]`; an array runs directly
     * @param options - cwd, env, stdin, timeoutS
     * @returns exit code, output, whether it timed out or was truncated, its duration
     * @throws {@link StrataError} `exec_failed` (422) for a program that cannot start
     */
    run(cmd: string | string[], options?: RunOptions): Promise<ExecResult>;
    /**
     * Starts a command as a session (`POST …/sessions`) and attaches to it
     * from output offset 0. Read its output with `for await`, or
     * {@link Session.text}; {@link Session.wait} gives its exit code.
     *
     * @param cmd - a string runs with `["sh", "-c", cmd]`; an array runs directly
     * @param options - cwd, env, tty, rows, cols, detachable, timeoutS
     * @returns the session, attached
     */
    start(cmd: string | string[], options?: StartOptions): Promise<Session>;
    /**
     * Attaches to a session already running (or exited in the last 10 minutes),
     * in the run its record names (`GET …/sessions/{sid}` first).
     *
     * @param sessionId - `se-…`
     * @param options - `since`: the output offset to start from (default 0)
     * @returns the session, attached
     */
    attach(sessionId: string, options?: AttachOptions): Promise<Session>;
    /**
     * Lists the sandbox's sessions, oldest first (exited ones for 10 minutes).
     *
     * @returns the records
     */
    list(): Promise<SessionRecord[]>;
    /**
     * Reads one session's record.
     *
     * @param sessionId - `se-…`
     * @returns its record
     */
    get(sessionId: string): Promise<SessionRecord>;
    /**
     * Ends a session: SIGTERM to its processes, SIGKILL 5 s later.
     *
     * @param sessionId - `se-…`
     * @returns its record
     */
    kill(sessionId: string): Promise<SessionRecord>;
}
/**
 * A running command whose streams come through a WebSocket attachment.
 *
 * A memory snapshot, a pause or a restore of the sandbox ends every
 * attachment (close code 1011): the session attaches again by itself, for
 * up to 55 s while the sandbox is busy, from the output offset it had
 * reached (`?since=`), so that no output is lost or seen twice; what is
 * written to stdin meanwhile is sent once attached again. A connection
 * that breaks (1006: hostproxy restarted) is attached again the same way.
 *
 * When the sandbox is paused or stopped (or stays busy longer), the
 * session fails: {@link Session.wait} and the output reject, with
 * `sandbox_not_running` for instance. Stdin written then is kept, and
 * {@link Session.reattach} (once the sandbox answers again: after a
 * snapshot that took longer, or a network outage) continues the session
 * from its offset, sending that stdin first. Once the session has exited or was detached, writing to it
 * throws `attachment_closed`.
 *
 * Every attachment names the generation of the session's record
 * (`?generation=`, docs/api.md "Generations"). A restore, a fork or a
 * resume after a pause loads the guest's memory again, and the session is
 * then another run, whose output after our offset is not what would have
 * followed ours: the attachment is refused, and the session ends with
 * `session_restored` (the output and {@link Session.wait} reject with it,
 * and so does {@link Session.reattach}) instead of splicing that run's
 * output after ours. `exec.attach(id, { since })` follows the new run.
 *
 * One consumer reads the output: iterate it, or call one of
 * {@link Session.text}, {@link Session.stdout}, {@link Session.output}.
 * At most 256 chunks (or 4 MiB) are held unread: then the attachment stops reading
 * (the command's output waits at the server) until the consumer catches
 * up. With the platform's `WebSocket`, which has no flow control, the
 * bound cannot be kept, and unread output is held in memory.
 *
 * @example
 * ```ts
 * const s = await sb.exec.start(["cat"]);
 * s.write("hello\n");
 * s.closeStdin();
 * for await (const chunk of s) process.stdout.write(chunk.data);
 * console.log("exit", await s.wait());
 * ```
 */
export declare class Session implements AsyncIterable<OutputChunk> {
    private readonly client;
    /** The session's id, `se-…`. */
    readonly id: string;
    /** The sandbox it runs in. */
    readonly sandboxId: string;
    /** Its record as `exec.start` or `exec.attach` read it. */
    readonly record: SessionRecord | undefined;
    /** The guest's generation the attachments name (the record's; undefined from a server that predates generations: nothing is checked then). */
    readonly generation: string | undefined;
    /** How many times it attached again: by itself after an operation on the sandbox ended its attachment, or by {@link Session.reattach}. */
    reattachments: number;
    /** Bytes of output the server no longer held when asked for them (`dropped` messages). */
    droppedBytes: number;
    private since;
    private conn;
    private outbox;
    private queue;
    private queuedBytes;
    private wake;
    /** No more output comes (exit, detach, or a failure until reattach). */
    private ended;
    private failure;
    private exitCode;
    private detached;
    /** Each run of attachments (the first, and each reattach) has its own; events of an older one are ignored. */
    private epoch;
    /** Reads of the attachment are paused (the queue is full). */
    private paused;
    /** wait() was called: with no reader, output beyond the bound is let go rather than hold the wait up. */
    private waited;
    /** Iterators of the output running now. */
    private readers;
    private exit;
    private settle;
    private first;
    private firstSettle;
    /** @internal */
    constructor(client: Strata, sandboxId: string, id: string, since: number, record?: SessionRecord);
    /** Starts a run of attachments: new promises for its end and its first attachment. */
    private begin;
    /** The output offset reached: bytes of stdout and stderr received, plus those dropped. */
    get offset(): number;
    /** @internal Resolves once the first attachment is open (rejects if it could not be). */
    attached(): Promise<void>;
    /**
     * Sends bytes to the command's standard input (split into frames of at
     * most 64 KiB); while not attached (an operation on the sandbox, or a
     * failure before {@link Session.reattach}), they are kept and sent once
     * attached again.
     *
     * @param data - a string (UTF-8) or bytes
     * @throws {@link StrataError} `attachment_closed` once the session has exited or was detached, or failed for good
     */
    write(data: string | Uint8Array): void;
    /**
     * Closes the command's standard input (`{"type":"eof"}`; on a terminal, ^D is typed).
     *
     * @throws {@link StrataError} `attachment_closed` once the session has exited or was detached, or failed for good
     */
    closeStdin(): void;
    /**
     * Resizes the session's terminal.
     *
     * @param rows - 1–1000
     * @param cols - 1–1000
     * @throws {@link StrataError} `attachment_closed` once the session has exited or was detached, or failed for good
     */
    resize(rows: number, cols: number): void;
    /**
     * Sends a signal to the session's process group.
     *
     * @param signal - `HUP INT QUIT KILL USR1 USR2 TERM CONT STOP TSTP WINCH`
     * @throws {@link StrataError} `attachment_closed` once the session has exited or was detached, or failed for good
     */
    signal(signal: string): void;
    /** Throws unless what is sent now can still reach the command. */
    private usable;
    /**
     * Ends the session (`DELETE …/sessions/{sid}`): SIGTERM to its
     * processes, SIGKILL 5 s later. Its output still comes until its exit.
     *
     * @returns its record
     */
    kill(): Promise<SessionRecord>;
    /**
     * Waits for the session's end. Output still unread is kept for a
     * reader; but while none reads it, what comes beyond 256 unread chunks
     * (or 4 MiB) is let go, so that the wait is not held up by output nobody reads.
     *
     * @returns its exit code: the program's status, `128+N` when signal N ended it, `-1` when its timeout did
     * @throws {@link StrataError} when the attachment could not be kept (`sandbox_not_running`,
     *   `attachment_closed`, `network_error`, …); `attachment_closed` (`data.detached`) after {@link Session.detach}
     */
    wait(): Promise<number>;
    /**
     * Closes this attachment without ending the session (a detachable
     * session carries on; one that is not gets SIGHUP). The output ends and
     * {@link Session.wait} rejects with `attachment_closed` (`data.detached`).
     * An attachment still being opened (after an operation on the sandbox)
     * is closed as soon as it opens.
     */
    detach(): void;
    /**
     * Attaches again, from the output offset reached, after the session
     * failed (its sandbox stayed busy longer than 55 s, or was paused; or
     * after {@link Session.detach}), in the same run of the session. The
     * stdin written since the failure (and during the gap before it) is
     * sent first. Then iterate the output, and {@link Session.wait}, again.
     * Does nothing while attached. After a pause and `sb.resume()`, or a
     * restore, the session is another run: `session_restored`.
     *
     * @throws {@link StrataError} `attachment_closed` when the session has exited; the attachment's
     *   error when it cannot be opened (`sandbox_not_running` while still paused; the session stays
     *   failed, and reattach may be tried again; `session_restored` once the session is another run)
     */
    reattach(): Promise<void>;
    /**
     * The output, chunk by chunk, until the session's end.
     *
     * @returns an iterator of chunks
     */
    [Symbol.asyncIterator](): AsyncIterator<OutputChunk>;
    /**
     * Reads the whole output and the exit code.
     *
     * @returns stdout and stderr (UTF-8) and the exit code
     */
    output(): Promise<SessionOutput>;
    /**
     * Reads the whole output, stdout and stderr as they came.
     *
     * @returns the output as UTF-8 text
     */
    text(): Promise<string>;
    /**
     * Reads the whole standard output (standard error is dropped).
     *
     * @returns stdout as UTF-8 text
     */
    stdout(): Promise<string>;
    private send;
    private flush;
    /** Whether output beyond the bound is let go: wait() was called and nobody reads. */
    private unread;
    /** Whether the queue holds as much unread output as it may. */
    private full;
    /** Pauses the attachment's reads while the queue is full, and reads again once it is half empty (or nobody reads). */
    private flow;
    private push;
    private finish;
    /** Attaches, and attaches again after an operation's 1011, until the exit (or until this run is over). */
    private pump;
    /** The error a session ends with when it is another run now (e: the refusal). */
    private restored;
    /**
     * One attachment: resolves with its close once it ends; undefined when
     * the run was over (detached) by the time it opened (it is closed at once).
     */
    private attachOnce;
}
