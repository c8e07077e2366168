/**
 * Commands: the one-shot exec and exec sessions ({@link Session}).
 *
 * @module
 */
import { camel, sandboxPath, sleep } from "./client.js";
import { StrataError } from "./errors.js";
import { openWs } from "./ws.js";
/** A command as an array runs directly; a string runs with `sh -c`. */
function argv(cmd) {
    return typeof cmd === "string" ? ["sh", "-c", cmd] : cmd;
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
export class Exec {
    client;
    sandboxId;
    /** @internal */
    constructor(client, sandboxId) {
        this.client = client;
        this.sandboxId = sandboxId;
    }
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
    async run(cmd, options = {}) {
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "exec"), {
            json: { cmd: argv(cmd), cwd: options.cwd, env: options.env, stdin: options.stdin, timeout_s: options.timeoutS },
        });
        return camel(data);
    }
    /**
     * Starts a command as a session (`POST …/sessions`) and attaches to it
     * from output offset 0. Read its output with `for await`, or
     * {@link Session.text}; {@link Session.wait} gives its exit code.
     *
     * @param cmd - a string runs with `["sh", "-c", cmd]`; an array runs directly
     * @param options - cwd, env, tty, rows, cols, detachable, timeoutS
     * @returns the session, attached
     */
    async start(cmd, options = {}) {
        const { data } = await this.client.call("POST", sandboxPath(this.sandboxId, "sessions"), {
            json: {
                cmd: argv(cmd),
                cwd: options.cwd,
                env: options.env,
                tty: options.tty,
                rows: options.rows,
                cols: options.cols,
                detachable: options.detachable,
                timeout_s: options.timeoutS,
            },
        });
        const record = camel(data);
        const s = new Session(this.client, this.sandboxId, record.id, 0, record);
        await s.attached();
        return s;
    }
    /**
     * Attaches to a session already running (or exited in the last 10 minutes),
     * in the run its record names (`GET …/sessions/{sid}` first).
     *
     * @param sessionId - `se-…`
     * @param options - `since`: the output offset to start from (default 0)
     * @returns the session, attached
     */
    async attach(sessionId, options = {}) {
        // The record names the generation the attachments will name (see Session).
        const record = await this.get(sessionId);
        const s = new Session(this.client, this.sandboxId, sessionId, options.since ?? 0, record);
        await s.attached();
        return s;
    }
    /**
     * Lists the sandbox's sessions, oldest first (exited ones for 10 minutes).
     *
     * @returns the records
     */
    async list() {
        const { data } = await this.client.call("GET", sandboxPath(this.sandboxId, "sessions"));
        return camel(data.sessions);
    }
    /**
     * Reads one session's record.
     *
     * @param sessionId - `se-…`
     * @returns its record
     */
    async get(sessionId) {
        const { data } = await this.client.call("GET", sandboxPath(this.sandboxId, "sessions", sessionId));
        return camel(data);
    }
    /**
     * Ends a session: SIGTERM to its processes, SIGKILL 5 s later.
     *
     * @param sessionId - `se-…`
     * @returns its record
     */
    async kill(sessionId) {
        const { data } = await this.client.call("DELETE", sandboxPath(this.sandboxId, "sessions", sessionId));
        return camel(data);
    }
}
/** How long an attachment ended by an operation on the sandbox is tried again (the server holds a session 60 s). */
const REATTACH_FOR_MS = 55_000;
/** The largest frame of an attachment, its stream byte included. */
const MAX_FRAME = 64 << 10;
/** Chunks of output held unread before the attachment stops reading (back-pressure)… */
const MAX_QUEUE = 256;
/** …or bytes of them, whichever comes first. */
const MAX_QUEUE_BYTES = 4 << 20;
/** Whether a session that failed with e may be attached again later (its sandbox paused or stopped, a broken connection…): not once it is another run (`session_restored`). */
function resumable(e) {
    return !(e instanceof StrataError && (e.status === 401 || e.status === 403 || e.status === 404 || e.code === "session_restored"));
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
export class Session {
    client;
    /** The session's id, `se-…`. */
    id;
    /** The sandbox it runs in. */
    sandboxId;
    /** Its record as `exec.start` or `exec.attach` read it. */
    record;
    /** The guest's generation the attachments name (the record's; undefined from a server that predates generations: nothing is checked then). */
    generation;
    /** How many times it attached again: by itself after an operation on the sandbox ended its attachment, or by {@link Session.reattach}. */
    reattachments = 0;
    /** Bytes of output the server no longer held when asked for them (`dropped` messages). */
    droppedBytes = 0;
    since;
    conn;
    outbox = [];
    queue = [];
    queuedBytes = 0;
    wake;
    /** No more output comes (exit, detach, or a failure until reattach). */
    ended = false;
    failure;
    exitCode;
    detached = false;
    /** Each run of attachments (the first, and each reattach) has its own; events of an older one are ignored. */
    epoch = 0;
    /** Reads of the attachment are paused (the queue is full). */
    paused = false;
    /** wait() was called: with no reader, output beyond the bound is let go rather than hold the wait up. */
    waited = false;
    /** Iterators of the output running now. */
    readers = 0;
    exit;
    settle;
    first;
    firstSettle;
    /** @internal */
    constructor(client, sandboxId, id, since, record) {
        this.client = client;
        this.id = id;
        this.sandboxId = sandboxId;
        this.since = since;
        this.record = record;
        this.generation = record?.generation;
        this.begin();
    }
    /** Starts a run of attachments: new promises for its end and its first attachment. */
    begin() {
        const epoch = ++this.epoch;
        this.ended = false;
        this.failure = undefined;
        this.exit = new Promise((resolve, reject) => (this.settle = { resolve, reject }));
        this.exit.catch(() => { });
        this.first = new Promise((resolve, reject) => (this.firstSettle = { resolve, reject }));
        this.first.catch(() => { });
        void this.pump(epoch);
    }
    /** The output offset reached: bytes of stdout and stderr received, plus those dropped. */
    get offset() {
        return this.since;
    }
    /** @internal Resolves once the first attachment is open (rejects if it could not be). */
    attached() {
        return this.first;
    }
    /**
     * Sends bytes to the command's standard input (split into frames of at
     * most 64 KiB); while not attached (an operation on the sandbox, or a
     * failure before {@link Session.reattach}), they are kept and sent once
     * attached again.
     *
     * @param data - a string (UTF-8) or bytes
     * @throws {@link StrataError} `attachment_closed` once the session has exited or was detached, or failed for good
     */
    write(data) {
        this.usable();
        const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
        for (let i = 0; i < bytes.length; i += MAX_FRAME - 1) {
            const part = bytes.subarray(i, i + MAX_FRAME - 1);
            const frame = new Uint8Array(part.length + 1);
            frame[0] = 0;
            frame.set(part, 1);
            this.send(frame);
        }
    }
    /**
     * Closes the command's standard input (`{"type":"eof"}`; on a terminal, ^D is typed).
     *
     * @throws {@link StrataError} `attachment_closed` once the session has exited or was detached, or failed for good
     */
    closeStdin() {
        this.usable();
        this.send(JSON.stringify({ type: "eof" }));
    }
    /**
     * Resizes the session's terminal.
     *
     * @param rows - 1–1000
     * @param cols - 1–1000
     * @throws {@link StrataError} `attachment_closed` once the session has exited or was detached, or failed for good
     */
    resize(rows, cols) {
        this.usable();
        this.send(JSON.stringify({ type: "resize", rows, cols }));
    }
    /**
     * Sends a signal to the session's process group.
     *
     * @param signal - `HUP INT QUIT KILL USR1 USR2 TERM CONT STOP TSTP WINCH`
     * @throws {@link StrataError} `attachment_closed` once the session has exited or was detached, or failed for good
     */
    signal(signal) {
        this.usable();
        this.send(JSON.stringify({ type: "signal", signal: signal.replace(/^SIG/, "") }));
    }
    /** Throws unless what is sent now can still reach the command. */
    usable() {
        if (this.exitCode !== undefined) {
            throw new StrataError("attachment_closed", `session ${this.id} has exited (${this.exitCode}): nothing more can be sent to it`, 0, { session: this.id, exitCode: this.exitCode });
        }
        if (this.detached) {
            throw new StrataError("attachment_closed", `session ${this.id} was detached: attach again (exec.attach or reattach()) to send to it`, 0, { session: this.id, detached: true });
        }
        if (this.ended && !resumable(this.failure)) {
            const why = this.failure instanceof Error ? this.failure.message : String(this.failure);
            throw new StrataError("attachment_closed", `session ${this.id} failed for good (${why}): nothing more can be sent to it`, 0, { session: this.id }, undefined, { cause: this.failure });
        }
    }
    /**
     * Ends the session (`DELETE …/sessions/{sid}`): SIGTERM to its
     * processes, SIGKILL 5 s later. Its output still comes until its exit.
     *
     * @returns its record
     */
    async kill() {
        const { data } = await this.client.call("DELETE", sandboxPath(this.sandboxId, "sessions", this.id));
        return camel(data);
    }
    /**
     * Waits for the session's end. Output still unread is kept for a
     * reader; but while none reads it, what comes beyond 256 unread chunks
     * (or 4 MiB) is let go, so that the wait is not held up by output nobody reads.
     *
     * @returns its exit code: the program's status, `128+N` when signal N ended it, `-1` when its timeout did
     * @throws {@link StrataError} when the attachment could not be kept (`sandbox_not_running`,
     *   `attachment_closed`, `network_error`, …); `attachment_closed` (`data.detached`) after {@link Session.detach}
     */
    wait() {
        this.waited = true;
        this.flow();
        return this.exit;
    }
    /**
     * Closes this attachment without ending the session (a detachable
     * session carries on; one that is not gets SIGHUP). The output ends and
     * {@link Session.wait} rejects with `attachment_closed` (`data.detached`).
     * An attachment still being opened (after an operation on the sandbox)
     * is closed as soon as it opens.
     */
    detach() {
        this.detached = true;
        if (this.ended)
            return;
        const conn = this.conn;
        this.conn = undefined;
        conn?.close(1000, "detached");
        this.finish(this.epoch, new StrataError("attachment_closed", `session ${this.id} was detached`, 0, { session: this.id, detached: true }));
    }
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
    async reattach() {
        if (!this.ended)
            return this.first;
        if (this.exitCode !== undefined) {
            throw new StrataError("attachment_closed", `session ${this.id} has exited (${this.exitCode})`, 0, { session: this.id, exitCode: this.exitCode });
        }
        this.detached = false;
        this.reattachments++;
        this.begin();
        return this.first;
    }
    /**
     * The output, chunk by chunk, until the session's end.
     *
     * @returns an iterator of chunks
     */
    async *[Symbol.asyncIterator]() {
        this.readers++;
        try {
            for (;;) {
                const c = this.queue.shift();
                if (c) {
                    this.queuedBytes -= c.data.length;
                    this.flow();
                    yield c;
                    continue;
                }
                if (this.ended) {
                    if (this.failure && !this.detached)
                        throw this.failure;
                    return;
                }
                await new Promise((r) => (this.wake = r));
            }
        }
        finally {
            this.readers--;
            this.flow();
        }
    }
    /**
     * Reads the whole output and the exit code.
     *
     * @returns stdout and stderr (UTF-8) and the exit code
     */
    async output() {
        const out = [];
        const err = [];
        for await (const c of this)
            (c.stream === "stdout" ? out : err).push(c.data);
        const dec = (l) => Buffer.concat(l).toString("utf8");
        return { stdout: dec(out), stderr: dec(err), exitCode: await this.wait() };
    }
    /**
     * Reads the whole output, stdout and stderr as they came.
     *
     * @returns the output as UTF-8 text
     */
    async text() {
        const all = [];
        for await (const c of this)
            all.push(c.data);
        return Buffer.concat(all).toString("utf8");
    }
    /**
     * Reads the whole standard output (standard error is dropped).
     *
     * @returns stdout as UTF-8 text
     */
    async stdout() {
        return (await this.output()).stdout;
    }
    send(frame) {
        if (this.outbox.length === 0 && this.conn?.send(frame))
            return;
        this.outbox.push(frame);
        this.flush();
    }
    flush() {
        while (this.conn && this.outbox.length > 0) {
            if (!this.conn.send(this.outbox[0]))
                return;
            this.outbox.shift();
        }
    }
    /** Whether output beyond the bound is let go: wait() was called and nobody reads. */
    unread() {
        return this.waited && this.readers === 0;
    }
    /** Whether the queue holds as much unread output as it may. */
    full() {
        return this.queue.length >= MAX_QUEUE || this.queuedBytes >= MAX_QUEUE_BYTES;
    }
    /** Pauses the attachment's reads while the queue is full, and reads again once it is half empty (or nobody reads). */
    flow() {
        const conn = this.conn;
        if (!this.paused && this.full() && !this.unread()) {
            this.paused = conn?.pause() ?? true;
        }
        else if (this.paused && ((this.queue.length <= MAX_QUEUE / 2 && this.queuedBytes <= MAX_QUEUE_BYTES / 2) || this.unread())) {
            this.paused = false;
            conn?.resume();
        }
    }
    push(c) {
        if (this.full() && this.unread())
            return;
        this.queue.push(c);
        this.queuedBytes += c.data.length;
        this.flow();
        const w = this.wake;
        this.wake = undefined;
        w?.();
    }
    finish(epoch, err) {
        if (this.ended || epoch !== this.epoch)
            return;
        this.ended = true;
        this.failure = err;
        if (this.exitCode !== undefined)
            this.outbox = [];
        if (err) {
            this.settle.reject(err);
            this.firstSettle.reject(err);
        }
        else
            this.settle.resolve(this.exitCode ?? 1);
        const w = this.wake;
        this.wake = undefined;
        w?.();
    }
    /** Attaches, and attaches again after an operation's 1011, until the exit (or until this run is over). */
    async pump(epoch) {
        let again = false;
        for (;;) {
            let closed;
            try {
                closed = await this.attachOnce(epoch, again);
            }
            catch (e) {
                this.finish(epoch, e);
                return;
            }
            if (epoch !== this.epoch || this.ended || closed === undefined)
                return;
            this.conn = undefined;
            if (this.exitCode !== undefined)
                return this.finish(epoch);
            if (closed.code === 1011 || closed.code === 1006) {
                again = true;
                this.reattachments++;
                continue;
            }
            return this.finish(epoch, new StrataError("attachment_closed", `the attachment closed before the command's exit (${closed.code}${closed.reason ? ": " + closed.reason : ""})`, 0, {
                session: this.id,
                closeCode: closed.code,
            }));
        }
    }
    /** The error a session ends with when it is another run now (e: the refusal). */
    restored(e) {
        return new StrataError("session_restored", `session ${this.id}: the sandbox was restored or forked since this session's attachment began, and the session is another run now, whose output from byte ${this.since} is not what came here; follow that run with exec.attach("${this.id}")`, e.status || 409, e.data, e.requestId, { cause: e });
    }
    /**
     * One attachment: resolves with its close once it ends; undefined when
     * the run was over (detached) by the time it opened (it is closed at once).
     */
    async attachOnce(epoch, again) {
        let done;
        const closed = new Promise((r) => (done = r));
        let conn;
        // Events of an attachment of a run that is over (detached, failed, or
        // replaced by a reattach) are ignored. (Output may come before open()
        // has returned: it is this attachment's.)
        const live = () => epoch === this.epoch && !this.ended;
        const handlers = {
            binary: (b) => {
                if (b.length === 0 || !live())
                    return;
                this.since += b.length - 1;
                this.push({ stream: b[0] === 2 ? "stderr" : "stdout", data: b.slice(1) });
            },
            text: (s) => {
                if (!live())
                    return;
                let m;
                try {
                    m = JSON.parse(s);
                }
                catch {
                    return;
                }
                if (m.type === "dropped") {
                    this.since += m.bytes ?? 0;
                    this.droppedBytes += m.bytes ?? 0;
                }
                else if (m.type === "exit") {
                    this.exitCode = typeof m.exit_code === "number" ? m.exit_code : 1;
                    conn?.close(1000);
                }
            },
            close: (code, reason) => done({ code, reason }),
        };
        const path = sandboxPath(this.sandboxId, "sessions", this.id, "attach");
        const open = async () => {
            const q = `?since=${this.since}` + (this.generation ? `&generation=${encodeURIComponent(this.generation)}` : "");
            this.client.notify("GET", path + q);
            try {
                return await openWs(this.client.apiUrl.replace(/^http/, "ws") + path + q, this.client.apiKey, handlers);
            }
            catch (e) {
                // The platform's WebSocket does not tell why an upgrade was
                // refused: the session's record does (404, 409 sandbox_not_running…),
                // and a generation it no longer has is a restored session.
                if (e instanceof StrataError && e.status === 0 && globalThis.WebSocket) {
                    const { data } = await this.client.call("GET", sandboxPath(this.sandboxId, "sessions", this.id));
                    if (this.generation && data.generation && data.generation !== this.generation) {
                        throw this.restored(new StrataError("session_restored", "restored", 409, { generation: data.generation }));
                    }
                }
                if (e instanceof StrataError && e.code === "session_restored")
                    throw this.restored(e);
                throw e;
            }
        };
        const over = () => epoch !== this.epoch || this.ended;
        if (!again) {
            conn = await open();
        }
        else {
            const deadline = Date.now() + REATTACH_FOR_MS;
            for (;;) {
                if (over())
                    return undefined;
                try {
                    conn = await open();
                    break;
                }
                catch (e) {
                    let busy = !(e instanceof StrataError) || e.status === 0 || e.status >= 500 || (e.status === 409 && e.code !== "sandbox_not_running" && e.code !== "session_restored");
                    if (e instanceof StrataError && e.code === "sandbox_not_running") {
                        const state = e.data.state;
                        busy = state !== "paused" && state !== "stopped" && state !== "error";
                    }
                    if (!busy || Date.now() > deadline || over()) {
                        if (e instanceof StrataError && e.code === "session_not_found") {
                            throw new StrataError("session_not_found", "the attachment was ended by an operation on the sandbox, and the session is gone (the sandbox was restored to a moment before it, or its guestd started again)", 404, e.data, e.requestId);
                        }
                        throw e;
                    }
                    await sleep(250);
                }
            }
        }
        if (over()) {
            // Detached (or over otherwise) while it was being opened: it is not kept.
            conn.close(1000, "detached");
            return undefined;
        }
        this.conn = conn;
        if (this.paused && !conn.pause())
            this.paused = false;
        if (!again)
            this.firstSettle.resolve();
        // The exit may have come before open() returned: nothing more will.
        if (this.exitCode !== undefined)
            conn.close(1000);
        else
            this.flush();
        return closed;
    }
}
//# sourceMappingURL=exec.js.map