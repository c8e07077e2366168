// The SDK against a real strata stack: CREATEOS_API_URL and
// CREATEOS_API_KEY (an account key) must name one. One sandbox is shared
// by every test (made in before); the forks the tests make are killed by
// the tests, and anything left by after.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, mkdir, readFile, readlink, rm, symlink, writeFile, stat as fsStat, chmod } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROUTES, Sandbox, Session, Strata, StrataError, readCredentials } from "@strata/sdk";
import { NON_SDK, documentRoutes } from "./openapi.js";

const API_URL = process.env.CREATEOS_API_URL;
const API_KEY = process.env.CREATEOS_API_KEY;

/** Asserts that p rejects with a StrataError of this status and code. */
async function rejectsWith(p: Promise<unknown>, status: number, code: string): Promise<StrataError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof StrataError, `expected a StrataError, got ${e}`);
    assert.equal(e.code, code, `code: ${e.message}`);
    assert.equal(e.status, status, `status of ${e.code}`);
    assert.ok(e.message.length > 0);
    return e;
  }
  assert.fail(`expected ${status} ${code}, and the call succeeded`);
}

if (!API_URL || !API_KEY) {
  test("a strata stack to test against", () => {
    assert.fail(
      "CREATEOS_API_URL and CREATEOS_API_KEY are not set: these tests run against a real strata stack. " +
        "Set CREATEOS_API_URL (e.g. http://127.0.0.1:8080) and CREATEOS_API_KEY (an account API key) and run npm test again.",
    );
  });
} else {
  const prefix = `sdkts-${randomBytes(3).toString("hex")}`;
  const requests: string[] = [];
  const options = { apiUrl: API_URL, apiKey: API_KEY, retryTimeoutMs: 180_000, onRequest: (m: string, p: string) => requests.push(`${m} ${p}`) };
  Strata.configure(options);
  const made: Sandbox[] = [];
  let sb: Sandbox;

  before(async () => {
    sb = await Sandbox.create({ name: `${prefix}-main` });
    made.push(sb);
  });

  after(async () => {
    for (const s of made) await s.kill().catch(() => {});
    for (const s of await Sandbox.list()) if (s.info.name?.startsWith(prefix)) await s.kill().catch(() => {});
  });

  describe("sandboxes", () => {
    test("create waits for running; list, connect and refresh see it", async () => {
      assert.equal(sb.info.state, "running");
      assert.match(sb.id, /^sb-[a-z0-9]{24}$/);
      assert.equal(sb.info.name, `${prefix}-main`);
      const all = await Sandbox.list();
      assert.ok(all.some((s) => s.id === sb.id));
      const again = await Sandbox.connect(sb.id);
      assert.equal(again.info.name, sb.info.name);
      const rec = await sb.refresh();
      assert.equal(rec.memoryMib, 512);
      assert.equal(rec.state, "running");
    });

    test("connect() with no id is the sandbox of the credentials file", async () => {
      const dir = await mkdtemp(join(tmpdir(), "sdkts-"));
      const file = join(dir, "credentials.env");
      await writeFile(file, `CREATEOS_API_URL='${API_URL}'\nCREATEOS_API_KEY='${API_KEY}'\nCREATEOS_SANDBOX_ID='${sb.id}'\n`);
      assert.deepEqual(readCredentials(file), { CREATEOS_API_URL: API_URL, CREATEOS_API_KEY: API_KEY, CREATEOS_SANDBOX_ID: sb.id });
      const saved = { u: process.env.CREATEOS_API_URL, k: process.env.CREATEOS_API_KEY, s: process.env.CREATEOS_SANDBOX_ID };
      delete process.env.CREATEOS_API_URL;
      delete process.env.CREATEOS_API_KEY;
      delete process.env.CREATEOS_SANDBOX_ID;
      try {
        const client = new Strata({ credentialsFile: file, onRequest: options.onRequest });
        assert.equal(client.apiUrl, API_URL.replace(/\/+$/, ""));
        const here = await Sandbox.connect(undefined, { client });
        assert.equal(here.id, sb.id);
        assert.throws(() => new Strata({ credentialsFile: join(dir, "none") }), (e: unknown) => e instanceof StrataError && e.code === "invalid_argument");
      } finally {
        process.env.CREATEOS_API_URL = saved.u;
        process.env.CREATEOS_API_KEY = saved.k;
        if (saved.s !== undefined) process.env.CREATEOS_SANDBOX_ID = saved.s;
        await rm(dir, { recursive: true });
      }
    });
  });

  describe("exec", () => {
    test("a string runs with sh -c, an array directly; cwd, env, stdin", async () => {
      const r = await sb.exec.run("echo out; echo err >&2; exit 3");
      assert.deepEqual([r.exitCode, r.stdout, r.stderr, r.timedOut, r.truncated], [3, "out\n", "err\n", false, false]);
      assert.equal(typeof r.durationMs, "number");
      const a = await sb.exec.run(["sh", "-c", 'echo "$PWD $GREETING"; cat'], { cwd: "/tmp", env: { GREETING: "hi" }, stdin: "in" });
      assert.equal(a.stdout, "/tmp hi\nin");
    });

    test("timeoutS kills the command", async () => {
      const r = await sb.exec.run("sleep 30", { timeoutS: 1 });
      assert.equal(r.timedOut, true);
      assert.equal(r.exitCode, -1);
    });

    test("a program that cannot start is 422 exec_failed", async () => {
      await rejectsWith(sb.exec.run(["/no/such/program"]), 422, "exec_failed");
    });
  });

  describe("sessions", () => {
    test("stdin, closeStdin, output, list and get", async () => {
      const s = await sb.exec.start("cat; echo done >&2");
      s.write("hello ");
      s.write(new TextEncoder().encode("world\n"));
      s.closeStdin();
      const out = await s.output();
      assert.deepEqual(out, { stdout: "hello world\n", stderr: "done\n", exitCode: 0 });
      assert.equal(s.offset, "hello world\ndone\n".length);
      const list = await sb.exec.list();
      assert.ok(list.some((r) => r.id === s.id));
      const rec = await sb.exec.get(s.id);
      assert.equal(rec.state, "exited");
      assert.equal(rec.exitCode, 0);
    });

    test("a terminal: resize", async () => {
      const s = await sb.exec.start(["sh", "-c", "read x; stty size"], { tty: true, rows: 10, cols: 40 });
      s.resize(30, 100);
      await new Promise((r) => setTimeout(r, 300));
      s.write("\r");
      const text = await s.text();
      assert.match(text, /30 100/);
      assert.equal(await s.wait(), 0);
    });

    test("signal and kill", async () => {
      const a = await sb.exec.start("sleep 60");
      a.signal("INT");
      assert.equal(await a.wait(), 130);
      const b = await sb.exec.start("sleep 60", { detachable: true });
      const rec = await b.kill();
      assert.equal(rec.id, b.id);
      assert.equal(await b.wait(), 143);
    });

    test("attach to a detachable session from an offset", async () => {
      const s = await sb.exec.start("echo one; sleep 1; echo two", { detachable: true });
      const it = s[Symbol.asyncIterator]();
      const first = await it.next();
      assert.equal(new TextDecoder().decode((first.value as { data: Uint8Array }).data), "one\n");
      s.detach();
      await assert.rejects(s.wait(), (e: unknown) => e instanceof StrataError && e.code === "attachment_closed" && e.data.detached === true);
      assert.throws(() => s.write("x"), (e: unknown) => e instanceof StrataError && e.code === "attachment_closed");
      const all = await sb.exec.attach(s.id, { since: 0 });
      assert.equal(await all.text(), "one\ntwo\n");
      const rest = await sb.exec.attach(s.id, { since: 4 });
      assert.equal(await rest.text(), "two\n");
      assert.equal(await rest.wait(), 0);
    });

    test("output is neither lost nor repeated across a memory snapshot (attach again)", async () => {
      const s: Session = await sb.exec.start("for i in $(seq 1 30); do echo line$i; sleep 0.1; done");
      const seen: string[] = [];
      let snapshotted: Promise<unknown> | undefined;
      for await (const c of s) {
        seen.push(new TextDecoder().decode(c.data));
        if (!snapshotted && seen.join("").includes("line3\n")) snapshotted = sb.snapshots.create({ comment: "reattach test" });
      }
      assert.equal(await s.wait(), 0);
      const snap = (await snapshotted) as { id: string };
      assert.equal(seen.join(""), Array.from({ length: 30 }, (_, i) => `line${i + 1}\n`).join(""));
      assert.ok(s.reattachments >= 1, "the snapshot ended the attachment, and the session attached again");
      await sb.snapshots.delete(snap.id);
    });

    test("unread output is bounded (the attachment stops reading), and nothing is lost", async () => {
      // 869 KB of output, in many frames; nothing read for a while. It
      // is less than the server holds of a session (1 MiB), so nothing
      // may be dropped whatever the frames' sizes: more, and whether the
      // oldest is dropped would depend on how the guest's reads cut the
      // output (smaller frames on a busy machine fill the 256 held
      // unread with fewer bytes).
      const s = await sb.exec.start("seq 1 140000");
      await new Promise((r) => setTimeout(r, 3000));
      const held = (s as unknown as { queue: unknown[] }).queue.length;
      assert.ok(held <= 300, `at most 256 chunks (and the few already parsed) are held unread, not ${held}`);
      const text = await s.text();
      assert.equal(await s.wait(), 0);
      const want = Array.from({ length: 140000 }, (_, i) => `${i + 1}\n`).join("");
      assert.equal(s.offset, want.length);
      assert.equal(s.droppedBytes, 0, "the server held the output while the attachment did not read");
      assert.equal(text, want);
      assert.throws(() => s.write("late"), (e: unknown) => e instanceof StrataError && e.code === "attachment_closed");
    });

    test("wait() with nobody reading is not held up by unread output", async () => {
      const s = await sb.exec.start("seq 1 300000");
      assert.equal(await s.wait(), 0);
    });

    test("stdin written while detached by a snapshot is sent after", async () => {
      const s = await sb.exec.start(["cat"]);
      s.write("a\n");
      const it = s[Symbol.asyncIterator]();
      assert.equal(new TextDecoder().decode(((await it.next()).value as { data: Uint8Array }).data), "a\n");
      const snapping = sb.snapshots.create({ comment: "stdin gap" });
      await new Promise((r) => setTimeout(r, 50));
      s.write("b\n");
      const snap = await snapping;
      s.write("c\n");
      s.closeStdin();
      let rest = "";
      for (let r = await it.next(); !r.done; r = await it.next()) rest += new TextDecoder().decode(r.value.data);
      assert.equal(rest, "b\nc\n");
      assert.equal(await s.wait(), 0);
      assert.ok(s.reattachments >= 1);
      await sb.snapshots.delete(snap.id);
    });
  });

  describe("files", () => {
    test("write, read, stat, list, remove", async () => {
      await sb.files.write("/workspace/f/a.txt", "hello", { parents: true, mode: 0o600 });
      assert.equal(await sb.files.readText("/workspace/f/a.txt"), "hello");
      assert.deepEqual(await sb.files.read("/workspace/f/a.txt"), new TextEncoder().encode("hello"));
      const st = await sb.files.stat("/workspace/f/a.txt");
      assert.deepEqual([st.type, st.size, st.mode], ["file", 5, 0o600]);
      assert.equal((await sb.files.stat("/workspace/f")).type, "dir");
      const ls = await sb.files.list("/workspace/f");
      assert.deepEqual(ls.map((e) => [e.name, e.type, e.sizeBytes, e.mode]), [["a.txt", "file", 5, "0600"]]);
      assert.ok((await sb.files.list("/")).some((e) => e.name === "workspace"));
      assert.equal(await sb.files.exists("/workspace/f/none"), false);
      await rejectsWith(sb.files.read("/workspace/f/none"), 404, "file_not_found");
      await rejectsWith(sb.files.remove("/workspace/f"), 409, "directory_not_empty");
      await sb.files.remove("/workspace/f/a.txt");
      await sb.files.remove("/workspace/f", { recursive: true });
      assert.equal(await sb.files.exists("/workspace/f"), false);
    });

    test("the root routes: stat, tar into /, and / itself is never removed (400 invalid_field)", async () => {
      assert.equal((await sb.files.stat("/")).type, "dir");
      const src = await mkdtemp(join(tmpdir(), "sdkts-root-"));
      try {
        await chmod(src, 0o755);
        await writeFile(join(src, `${prefix}-root.txt`), "at the root\n");
        await sb.files.upload(src, "/");
        assert.equal(await sb.files.readText(`/${prefix}-root.txt`), "at the root\n");
        assert.equal((await sb.exec.run("stat -c %a /")).stdout.trim(), "755");
        await sb.files.remove(`/${prefix}-root.txt`);
      } finally {
        await rm(src, { recursive: true });
      }
      const e = await rejectsWith(sb.files.remove("/", { recursive: true }), 400, "invalid_field");
      assert.ok(e.data.field);
    });

    test("a large file streams both ways", async () => {
      const size = 24 << 20;
      const seed = randomBytes(1 << 16);
      const want = createHash("sha256");
      async function* gen() {
        for (let n = 0; n < size; n += seed.length) {
          const chunk = Buffer.from(seed);
          chunk.writeUInt32BE(n, 0);
          want.update(chunk);
          yield new Uint8Array(chunk);
        }
      }
      const w = await sb.files.writeStream("/workspace/big.bin", gen());
      assert.equal(w.sizeBytes, size);
      const digest = want.digest("hex");
      const got = createHash("sha256");
      let n = 0;
      for await (const chunk of await sb.files.readStream("/workspace/big.bin")) {
        got.update(chunk);
        n += chunk.length;
      }
      assert.equal(n, size);
      assert.equal(got.digest("hex"), digest);
      assert.equal((await sb.exec.run("sha256sum /workspace/big.bin")).stdout.split(" ")[0], digest);
      await sb.files.remove("/workspace/big.bin");
    });

    test("upload and download a tree as tar", async () => {
      const src = await mkdtemp(join(tmpdir(), "sdkts-up-"));
      const dst = await mkdtemp(join(tmpdir(), "sdkts-down-"));
      try {
        await mkdir(join(src, "sub/deep"), { recursive: true });
        await writeFile(join(src, "top.txt"), "top\n");
        await writeFile(join(src, "sub/deep/run.sh"), "#!/bin/sh\necho run\n");
        await chmod(join(src, "sub/deep/run.sh"), 0o755);
        await symlink("top.txt", join(src, "link"));
        const w = await sb.files.upload(src, "/workspace/tree");
        assert.equal(w.path, "/workspace/tree");
        assert.equal((await sb.exec.run("/workspace/tree/sub/deep/run.sh; cat /workspace/tree/link")).stdout, "run\ntop\n");
        await sb.files.download("/workspace/tree", dst);
        assert.equal(await readFile(join(dst, "top.txt"), "utf8"), "top\n");
        assert.equal((await fsStat(join(dst, "sub/deep/run.sh"))).mode & 0o777, 0o755);
        assert.equal(await readlink(join(dst, "link")), "top.txt");
        await sb.files.remove("/workspace/tree", { recursive: true });
      } finally {
        await rm(src, { recursive: true });
        await rm(dst, { recursive: true });
      }
    });

    test("a tar carries the directory's entries, not the directory (its mode is kept); an empty directory; no tar", async () => {
      const src = await mkdtemp(join(tmpdir(), "sdkts-entries-"));
      const empty = await mkdtemp(join(tmpdir(), "sdkts-empty-"));
      const dst = await mkdtemp(join(tmpdir(), "sdkts-notar-"));
      try {
        await chmod(src, 0o700);
        await writeFile(join(src, "-dash.txt"), "dash\n");
        await writeFile(join(src, "plain.txt"), "plain\n");
        await sb.exec.run("mkdir -m 711 /workspace/kept");
        await sb.files.upload(src, "/workspace/kept");
        assert.equal((await sb.exec.run("stat -c %a /workspace/kept")).stdout.trim(), "711", "no ./ entry set the directory's mode");
        assert.equal(await sb.files.readText("/workspace/kept/-dash.txt"), "dash\n");
        assert.deepEqual((await sb.files.list("/workspace/kept")).map((e) => e.name), ["-dash.txt", "plain.txt"]);
        // list() of a file is refused from the answer's headers.
        const e = await rejectsWith(sb.files.list("/workspace/kept/plain.txt"), 0, "invalid_argument");
        assert.equal(e.data.path, "/workspace/kept/plain.txt");
        await rejectsWith(sb.files.read("/workspace/kept"), 0, "invalid_argument");
        await rejectsWith(sb.files.download("/workspace/kept/plain.txt", dst), 0, "invalid_argument");

        await sb.files.upload(empty, "/workspace/kept/empty");
        assert.equal((await sb.files.stat("/workspace/kept/empty")).type, "dir");
        await rejectsWith(sb.files.upload(join(empty, "none"), "/workspace/kept/none"), 0, "invalid_argument");

        // No tar on the PATH: a StrataError, not a crash.
        const path = process.env.PATH;
        process.env.PATH = join(empty, "no-bin");
        try {
          await rejectsWith(sb.files.upload(src, "/workspace/kept/notar"), 0, "tar_failed");
          await rejectsWith(sb.files.download("/workspace/kept", dst), 0, "tar_failed");
        } finally {
          process.env.PATH = path;
        }
        assert.equal(await sb.files.exists("/workspace/kept/notar"), false);
        // The download refused above let its answer go: another works.
        await sb.files.download("/workspace/kept", dst);
        assert.equal(await readFile(join(dst, "plain.txt"), "utf8"), "plain\n");
        await sb.files.remove("/workspace/kept", { recursive: true });
      } finally {
        await rm(src, { recursive: true });
        await rm(empty, { recursive: true });
        await rm(dst, { recursive: true });
      }
    });
  });

  describe("directory checkpoints", () => {
    const dir = "/workspace/proj";
    test("create, list, changes, files of a checkpoint, restore-paths, clone, directories, release, restore, delete", async () => {
      await sb.files.write(`${dir}/a.txt`, "A1", { parents: true });
      await sb.files.write(`${dir}/src/b.txt`, "B1", { parents: true });
      const one = await sb.checkpoints.create({ path: dir, name: "one" });
      assert.match(one.id, /^cp_[A-Za-z0-9_-]{22}$/);
      assert.equal(one.parentId, undefined);
      await sb.files.write(`${dir}/a.txt`, "A2");
      await sb.files.write(`${dir}/c.txt`, "C");
      await sb.files.remove(`${dir}/src/b.txt`);
      const two = await sb.checkpoints.create({ path: dir, name: "two", retention: { maxCount: 10 } });
      assert.equal(two.parentId, one.id);
      assert.deepEqual((await sb.checkpoints.list({ path: dir })).map((c) => c.id), [one.id, two.id]);

      const changes = await sb.checkpoints.changes(two.id);
      assert.deepEqual(changes.map((c) => [c.path, c.change]), [["a.txt", "modified"], ["c.txt", "added"], ["src/b.txt", "deleted"]]);
      assert.deepEqual((await sb.checkpoints.changes(two.id, { against: one.id })).map((c) => c.path), ["a.txt", "c.txt", "src/b.txt"]);
      assert.deepEqual(await sb.checkpoints.changes(two.id, { against: "live" }), []);

      assert.equal(new TextDecoder().decode(await sb.checkpoints.readFile(one.id, "a.txt")), "A1");
      assert.equal(new TextDecoder().decode(await sb.checkpoints.readFile(one.id, "/src/b.txt")), "B1");
      assert.deepEqual((await sb.checkpoints.listFiles(one.id)).map((e) => e.name), ["a.txt", "src"]);
      assert.deepEqual((await sb.checkpoints.listFiles(one.id, "src")).map((e) => e.name), ["b.txt"]);
      await rejectsWith(sb.checkpoints.readFile(two.id, "src/b.txt"), 404, "entry_not_found");

      const rp = await sb.checkpoints.restorePaths(one.id, ["src"]);
      assert.deepEqual(rp.paths, ["src"]);
      assert.equal(await sb.files.readText(`${dir}/src/b.txt`), "B1");
      assert.equal(await sb.files.readText(`${dir}/a.txt`), "A2");

      const clone = await sb.checkpoints.clone(one.id, "/workspace/proj-clone");
      assert.deepEqual(clone, { path: "/workspace/proj-clone", fromCheckpointId: one.id });
      assert.equal(await sb.files.readText("/workspace/proj-clone/a.txt"), "A1");
      const dirs = await sb.checkpoints.directories();
      assert.ok(dirs.some((d) => d.path === dir && d.state === "ready"));
      assert.ok(dirs.some((d) => d.path === "/workspace/proj-clone"));
      const rel = await sb.checkpoints.release("/workspace/proj-clone");
      assert.deepEqual(rel.deletedCheckpointIds, []);

      await sb.files.write(`${dir}/unsaved.txt`, "U");
      const restored = await sb.checkpoints.restore(one.id);
      assert.equal(restored.checkpointId, one.id);
      assert.ok(restored.safetyCheckpointId, "unsaved changes are kept as a safety checkpoint");
      assert.equal(await sb.files.readText(`${dir}/a.txt`), "A1");
      assert.equal(await sb.files.exists(`${dir}/unsaved.txt`), false);

      await sb.checkpoints.delete(two.id);
      assert.ok(!(await sb.checkpoints.list()).some((c) => c.id === two.id));
      await rejectsWith(sb.checkpoints.restore(two.id), 404, "checkpoint_not_found");
      const released = await sb.checkpoints.release(dir);
      assert.ok(released.deletedCheckpointIds.includes(one.id));
      await sb.files.remove(dir, { recursive: true });
      await sb.files.remove("/workspace/proj-clone", { recursive: true });
    });
  });

  describe("VM snapshots and forks", () => {
    test("create, list, get, pin, unpin, restore, delete (and the seeds' names)", async () => {
      await sb.files.write("/workspace/marker", "before");
      const snap = await sb.snapshots.create({ comment: "sdk test", memory: true });
      assert.deepEqual([snap.status, snap.memory, snap.comment], ["ready", true, "sdk test"]);
      const disk = await sb.snapshots.create({ memory: false });
      assert.equal(disk.memory, false);
      assert.deepEqual((await sb.snapshots.list()).filter((s) => !s.auto).map((s) => s.id).slice(-2), [snap.id, disk.id]);
      assert.equal((await sb.snapshots.get(snap.id)).id, snap.id);
      assert.equal((await sb.snapshots.pin(snap.id)).pinned, true);
      assert.equal((await sb.snapshots.unpin(snap.id)).pinned, false);

      await sb.files.write("/workspace/marker", "after");
      const r = await sb.restoreCheckpoint(snap.id);
      assert.equal(r.snapshotId, snap.id);
      assert.match(r.autoId, /^auto-\d+$/);
      assert.equal(sb.info.state, "running");
      assert.equal(await sb.files.readText("/workspace/marker"), "before");
      assert.ok((await sb.listCheckpoints()).some((c) => c.snapshotId === r.autoId && c.id.startsWith("sn-")));
      await sb.deleteCheckpoint(disk.id);
      await sb.snapshots.delete(snap.id);
      // The automatic snapshot is processing until its memory is written: a delete meanwhile is 409 operation_in_progress.
      for (let i = 0; i < 600 && (await sb.snapshots.get(r.autoId)).status === "processing"; i++) await new Promise((res) => setTimeout(res, 100));
      await sb.snapshots.delete(r.autoId);
      await rejectsWith(sb.snapshots.get(snap.id), 404, "snapshot_not_found");

      const named = await sb.createCheckpoint("after-build");
      assert.deepEqual([named.name, named.sandboxId, named.status, named.kind], ["after-build", sb.id, "ready", "full"]);
      assert.match(named.id, /^sn-[a-z0-9]{24}$/, "a CheckpointInfo's id is the snapshot's ref");
      assert.equal((await sb.snapshots.get("after-build")).id, named.snapshotId);
      assert.equal((await sb.snapshots.get(named.id)).ref, named.id, "a ref wherever an id goes");
      await rejectsWith(sb.createCheckpoint("after-build"), 409, "name_taken");
      await sb.deleteCheckpoint("after-build");
      await rejectsWith(sb.snapshots.get(named.id), 404, "snapshot_not_found");
    });

    test("fork one, fork many, createFromCheckpoint", async () => {
      await sb.files.write("/workspace/origin", sb.id);
      // The source's network, which a fork without one keeps.
      const set = await sb.network.set({ egress: "list", allow: ["PyPI.org.", "*.github.com"] });
      assert.deepEqual([set.egress, set.allow], ["list", ["pypi.org", "*.github.com"]], "the canonical form");
      assert.ok(set.usage && set.usage.bytesOut >= 0 && set.usage.refused >= 0, "usage while it runs");
      await rejectsWith(sb.network.set({ egress: "all", allow: ["pypi.org"] }), 400, "invalid_field");
      const snap = await sb.snapshots.create({ comment: "fork source" });
      const one = await sb.fork(snap.id, { name: `${prefix}-fork`, env: { SEED: "loam" }, labels: { owner: prefix } });
      made.push(one);
      assert.equal(one.info.state, "running");
      assert.deepEqual(one.info.from, { sandbox: sb.id, snapshot: snap.id });
      assert.equal(await one.files.readText("/workspace/origin"), sb.id);
      assert.equal((await one.network.get()).egress, "list", "a fork keeps its source's network");
      // Its own env under each call's, and labels; found by its name wherever its id goes.
      const byName = await Sandbox.connect(`${prefix}-fork`);
      assert.equal(byName.id, one.id);
      assert.deepEqual(byName.info.env, { SEED: "loam" });
      assert.equal((await byName.exec.run("echo $SEED $X", { env: { X: "call" } })).stdout, "loam call\n");
      assert.equal((await byName.exec.run("echo $SEED", { env: { SEED: "mine" } })).stdout, "mine\n");
      assert.deepEqual((await Sandbox.list({ labels: { owner: prefix } })).map((s) => s.id), [one.id]);
      assert.deepEqual((await byName.setLabels({ owner: prefix, tier: "a" })).labels, { owner: prefix, tier: "a" });
      assert.deepEqual(await Sandbox.list({ labels: { owner: prefix, tier: "b" } }), []);
      await one.kill();
      await rejectsWith(Sandbox.connect(`${prefix}-fork`), 404, "sandbox_not_found");

      const many = await sb.fork(snap.id, { count: 2, name: `${prefix}-many`, network: { egress: "none" } });
      made.push(...many);
      assert.equal(many.length, 2);
      assert.deepEqual(many.failed, []);
      assert.deepEqual(many.map((f) => f.info.name), [`${prefix}-many-1`, `${prefix}-many-2`]);
      assert.deepEqual(many.map((f) => f.info.state), ["running", "running"]);
      for (const f of many) assert.equal((await f.exec.run("cat /workspace/origin")).stdout, sb.id);
      for (const f of many) assert.equal((await f.network.get()).egress, "none", "a fork's own network");
      await Promise.all(many.map((f) => f.kill()));

      const seedStyle = await Sandbox.createFromCheckpoint(snap, { name: `${prefix}-seed` });
      made.push(seedStyle);
      assert.equal(seedStyle.info.state, "running");
      await seedStyle.kill();
      const byId = await Sandbox.createFromCheckpoint(snap.id, { sandbox: sb.id, name: `${prefix}-byid`, wait: false });
      made.push(byId);
      await byId.waitFor("running");
      await byId.kill();
      await assert.rejects(Sandbox.createFromCheckpoint(snap.id), (e: unknown) => e instanceof StrataError && e.code === "invalid_argument");
      const byRef = await Sandbox.createFromCheckpoint(snap.ref!, { name: `${prefix}-byref`, labels: { owner: "docs" } });
      made.push(byRef);
      assert.deepEqual([byRef.info.state, byRef.info.labels], ["running", { owner: "docs" }]);
      await byRef.kill();
      await sb.snapshots.delete(snap.id);
      await sb.files.remove("/workspace/origin");
      assert.equal((await sb.network.set({ egress: "all" })).egress, "all");
    });
  });

  describe("access tokens", () => {
    test("a default token: checkpoints and snapshots, not exec or files (403 naming the scope)", async () => {
      await sb.accessToken.revoke();
      const issued = await sb.accessToken.issue();
      try {
        assert.deepEqual(issued.scopes, ["checkpoints", "snapshots"]);
        const mine = await Sandbox.connect(sb.id, { client: new Strata({ apiUrl: API_URL, apiKey: issued.token!, onRequest: options.onRequest }) });
        assert.ok(Array.isArray(await mine.checkpoints.list()));
        assert.ok(Array.isArray(await mine.snapshots.list()));
        assert.equal((await rejectsWith(mine.exec.run("true"), 403, "forbidden")).data.scope, "exec");
        assert.equal((await rejectsWith(mine.files.read("/etc/hostname"), 403, "forbidden")).data.scope, "files");
      } finally {
        await sb.accessToken.revoke();
      }
    });

    test("issue, get, rotate, revoke; what a token may do", async () => {
      await sb.accessToken.revoke();
      const issued = await sb.accessToken.issue({ scopes: ["checkpoints", "snapshots", "exec", "files"] });
      try {
        assert.match(issued.token ?? "", /^sbt_/);
        assert.equal(issued.hint, issued.token!.slice(-4));
        assert.deepEqual(issued.scopes, ["checkpoints", "snapshots", "exec", "files"]);
        await rejectsWith(sb.accessToken.issue(), 409, "token_exists");
        assert.deepEqual((await sb.accessToken.get()).enabled, true);
        assert.deepEqual((await sb.accessToken.get()).scopes, ["checkpoints", "snapshots", "exec", "files"]);

        // A token may not read the sandbox's record (403): connect still works, with its id only.
        const tokenClient = new Strata({ apiUrl: API_URL, apiKey: issued.token!, onRequest: options.onRequest });
        await rejectsWith(tokenClient.call("GET", `/v1/sandboxes/${sb.id}`), 403, "forbidden");
        const mine = await Sandbox.connect(sb.id, { client: tokenClient });
        assert.equal(mine.id, sb.id);
        assert.equal(mine.client, tokenClient);
        assert.deepEqual(mine.info, { id: sb.id });
        assert.ok(Array.isArray(await mine.checkpoints.list()));
        assert.equal(await mine.files.exists("/workspace"), true);
        assert.ok(Array.isArray(await mine.snapshots.list()));
        const s = await mine.exec.start("echo via token");
        assert.equal(await s.text(), "via token\n");
        // As inside the sandbox: connect() with no id is the client's sandbox.
        const inside = new Strata({ apiUrl: API_URL, apiKey: issued.token!, sandboxId: sb.id, onRequest: options.onRequest });
        const here = await Sandbox.connect(undefined, { client: inside });
        assert.equal(here.id, sb.id);
        assert.ok(Array.isArray(await here.checkpoints.list()));
        // 403: a token on lifecycle and on token management.
        await rejectsWith(mine.pause(), 403, "forbidden");
        await rejectsWith(mine.accessToken.get(), 403, "forbidden");
        await rejectsWith(mine.refresh(), 403, "forbidden");
        // The account key connects with the whole record.
        assert.equal((await Sandbox.connect(sb.id)).info.state, "running");

        const rotated = await sb.accessToken.rotate();
        assert.notEqual(rotated.token, issued.token);
        assert.deepEqual(rotated.scopes, issued.scopes);
        // 401: the rotated-out token.
        await rejectsWith(mine.checkpoints.list(), 401, "unauthorized");
        await rejectsWith(Sandbox.connect(sb.id, { client: tokenClient }), 401, "unauthorized");
      } finally {
        await sb.accessToken.revoke();
      }
      assert.equal((await sb.accessToken.get()).enabled, false);
      await rejectsWith(sb.accessToken.rotate(), 404, "token_not_found");
    });

    test("the access setting: shown, changed, checked", async () => {
      assert.deepEqual((await sb.refresh()).access, { scopes: ["checkpoints", "snapshots"] });
      try {
        assert.equal((await sb.setAccess("none")).access, "none");
        assert.equal(sb.info.access, "none");
        // Inside, the guest now has no key at all.
        const env = await sb.exec.run(["sh", "-c", "grep -c CREATEOS_API_KEY /run/strata/credentials.env || true"]);
        assert.equal(env.stdout.trim(), "0");
        assert.deepEqual((await sb.setAccess({ scopes: ["exec", "checkpoints"] })).access, { scopes: ["checkpoints", "exec"] });
        await rejectsWith(sb.setAccess({ scopes: ["root" as "exec"] }), 400, "invalid_field");
      } finally {
        await sb.setAccess({ scopes: ["checkpoints", "snapshots"] });
      }
    });
  });

  describe("errors", () => {
    test("400 invalid_field", async () => {
      const e = await rejectsWith(Sandbox.create({ memoryMib: 1 }), 400, "invalid_field");
      assert.equal(e.data.field, "memory_mib");
      assert.ok(e.requestId);
    });
    test("401 unauthorized", async () => {
      const bad = new Strata({ apiUrl: API_URL, apiKey: "sk_not-a-key-of-this-stack-0000000000000000000" });
      await rejectsWith(Sandbox.list({ client: bad }), 401, "unauthorized");
    });
    test("404 sandbox_not_found, snapshot_not_found, session_not_found", async () => {
      await rejectsWith(Sandbox.connect("sb-aaaaaaaaaaaaaaaaaaaaaaaa"), 404, "sandbox_not_found");
      await rejectsWith(sb.snapshots.get("v999"), 404, "snapshot_not_found");
      await rejectsWith(sb.exec.attach("se-0000000000000000"), 404, "session_not_found");
    });
    test("409 conflict: name_taken", async () => {
      await rejectsWith(Sandbox.create({ name: sb.info.name }), 409, "name_taken");
    });
  });

  describe("lifecycle", () => {
    test("pause and resume; a detachable session survives: reattach() sends the stdin written meanwhile", async () => {
      const s = await sb.exec.start("echo before; read line; echo \"got $line\"", { detachable: true });
      const it = s[Symbol.asyncIterator]();
      assert.equal(new TextDecoder().decode(((await it.next()).value as { data: Uint8Array }).data), "before\n");
      await sb.pause();
      assert.equal(sb.info.state, "paused");
      // A paused sandbox is not attached again by itself.
      await assert.rejects(s.wait(), (e: unknown) => e instanceof StrataError && e.code === "sandbox_not_running" && e.data.state === "paused");
      await assert.rejects(it.next(), (e: unknown) => e instanceof StrataError && e.code === "sandbox_not_running");
      await rejectsWith(sb.exec.run("true"), 409, "sandbox_not_running");
      s.write("kept\n");
      await rejectsWith(s.reattach(), 409, "sandbox_not_running");
      await sb.resume();
      assert.equal(sb.info.state, "running");
      const n = s.reattachments;
      await s.reattach();
      assert.equal(s.reattachments, n + 1);
      assert.equal(await s.text(), "got kept\n");
      assert.equal(await s.wait(), 0);
      await rejectsWith(s.reattach(), 0, "attachment_closed");
      assert.throws(() => s.closeStdin(), (e: unknown) => e instanceof StrataError && e.code === "attachment_closed");
    });

    test("pause and resume; another attachment continues from the offset", async () => {
      const s = await sb.exec.start("echo before; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo after", { detachable: true });
      const it = s[Symbol.asyncIterator]();
      assert.equal(new TextDecoder().decode(((await it.next()).value as { data: Uint8Array }).data), "before\n");
      await sb.pause();
      await assert.rejects(s.wait(), (e: unknown) => e instanceof StrataError && e.code === "sandbox_not_running");
      await sb.resume();
      const again = await sb.exec.attach(s.id, { since: s.offset });
      await sb.exec.run("touch /tmp/go");
      assert.equal(await again.text(), "after\n");
      assert.equal(await again.wait(), 0);
    });

    test("stop and start", async () => {
      await sb.stop();
      assert.equal(sb.info.state, "stopped");
      await rejectsWith(sb.checkpoints.list(), 409, "sandbox_not_running");
      await sb.start();
      assert.equal(sb.info.state, "running");
      assert.equal((await sb.exec.run("echo up")).stdout, "up\n");
    });

    test("kill deletes it", async () => {
      const id = sb.id;
      await sb.kill();
      assert.equal(sb.info.state, "destroyed");
      await rejectsWith(Sandbox.connect(id), 404, "sandbox_not_found");
    });
  });

  describe("one description, three clients", () => {
    test("every request these tests made is a route of ROUTES, and every SDK route was called", () => {
      const doc = [...documentRoutes()].filter((r) => !NON_SDK.has(r));
      const matchers = doc.map((r) => {
        const [m, p] = r.split(" ") as [string, string];
        const re = new RegExp("^" + p.replace(/\{path\}/, ".+").replace(/\{[a-z]+\}/g, "[^/]+") + "(\\?.*)?$");
        return { r, m, re };
      });
      const inTable = new Set(Object.values(ROUTES).flat());
      const called = new Set<string>();
      for (const req of requests) {
        const [m, p] = req.split(" ") as [string, string];
        const hit = matchers.find((x) => x.m === m && x.re.test(p));
        assert.ok(hit, `a request matches no route of the document: ${req}`);
        assert.ok(inTable.has(hit.r), `${req} (${hit.r}) is not in ROUTES`);
        called.add(hit.r);
      }
      const never = doc.filter((r) => !called.has(r));
      assert.deepEqual(never, [], `routes these tests never called: ${never.join(", ")}`);
    });
  });
}
