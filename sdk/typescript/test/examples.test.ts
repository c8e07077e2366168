// The seeds' examples (examples/*.ts) against a real strata stack, each
// run as written (its module's top-level code, imported once) and then
// checked through what it exports; whatever sandbox it made is killed
// after it, passed or failed. CREATEOS_API_URL and CREATEOS_API_KEY (an
// account key) must name the stack. This file runs after sdk.test.js,
// whose sandboxes are gone by then: the examples make up to four at once.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { Sandbox, Strata } from "@strata/sdk";
import type { CheckpointInfo } from "@strata/sdk";

const API_URL = process.env.CREATEOS_API_URL;
const API_KEY = process.env.CREATEOS_API_KEY;

/**
 * Runs an example: setup, then its module, then check on its exports;
 * every sandbox that was not there before is killed at the end.
 */
async function run<T>(module: string, check: (m: T) => Promise<void>, setup?: () => Promise<unknown>): Promise<void> {
  const before = new Set((await Sandbox.list()).map((s) => s.id));
  try {
    await setup?.();
    await check((await import(module)) as T);
  } finally {
    for (const s of await Sandbox.list()) if (!before.has(s.id)) await s.kill().catch(() => {});
  }
}

if (!API_URL || !API_KEY) {
  test("a strata stack to test the examples against", () => {
    assert.fail("CREATEOS_API_URL and CREATEOS_API_KEY are not set: the examples run against a real strata stack.");
  });
} else {
  Strata.configure({ apiUrl: API_URL, apiKey: API_KEY, retryTimeoutMs: 180_000 });

  describe("the seeds' examples, as written", () => {
    test("OpenComputer: checkpoint after setup, fork two (examples/opencomputer-checkpoints.ts)", async () => {
      type M = { sandbox: Sandbox; cp: CheckpointInfo; a: Sandbox; b: Sandbox };
      await run<M>("../examples/opencomputer-checkpoints.js", async ({ sandbox, cp, a, b }) => {
        assert.match(cp.id, /^sn-[a-z0-9]{24}$/);
        assert.deepEqual([cp.sandboxId, cp.name, cp.status, cp.kind], [sandbox.id, "after-build", "ready", "full"]);
        assert.notEqual(a.id, b.id);
        for (const f of [a, b]) {
          assert.deepEqual(f.info.from, { sandbox: sandbox.id, snapshot: cp.snapshotId });
          assert.equal((await f.exec.run("cat /app/dist/app.txt")).stdout, "built\n", "each fork has the build");
        }
        assert.equal((await a.exec.run("sh test.sh unit", { cwd: "/app" })).stdout, "unit tests pass\n");
      });
    });

    test("OpenComputer: the API reference, snippet after snippet (examples/opencomputer-reference.ts)", async () => {
      type M = { sandbox: Sandbox; checkpoint: CheckpointInfo; checkpoints: CheckpointInfo[]; forked: Sandbox };
      await run<M>("../examples/opencomputer-reference.js", async ({ sandbox, checkpoint, checkpoints, forked }) => {
        assert.deepEqual([checkpoint.name, checkpoint.status, checkpoint.kind], ["before-migration", "ready", "full"]);
        assert.deepEqual(
          checkpoints.map((c) => [c.name, c.kind, c.status]),
          [
            ["before-migration", "full", "ready"],
            ["autosave", "disk_only", "ready"],
          ],
        );
        assert.equal(forked.info.state, "running");
        assert.deepEqual(forked.info.from, { sandbox: sandbox.id, snapshot: checkpoint.snapshotId });
        const left = await sandbox.listCheckpoints();
        assert.ok(!left.some((c) => c.id === checkpoint.id), "deleted");
        assert.ok(left.some((c) => c.name === "autosave"));
      });
    });

    test("OpenComputer: parallel exploration (examples/opencomputer-parallel-exploration.ts)", async () => {
      type M = { results: { strategy: string; exitCode: number }[] };
      await run<M>("../examples/opencomputer-parallel-exploration.js", async ({ results }) => {
        assert.deepEqual(results, [
          { strategy: "--strategy=ours", exitCode: 0 },
          { strategy: "--strategy=theirs", exitCode: 1 },
          { strategy: "--strategy=recursive", exitCode: 0 },
        ]);
      });
    });

    test("loam: createCheckpoint({comment}), restore, fork(id, {name, labels}), delete (examples/loam.ts)", async () => {
      type M = { box: Sandbox; cp: CheckpointInfo; fork: Sandbox };
      await run<M>(
        "../examples/loam.js",
        async ({ box, cp, fork }) => {
          assert.equal(box.info.name, "scratch");
          assert.deepEqual([cp.comment, cp.kind], ["before upgrade", "full"]);
          assert.deepEqual([fork.info.name, fork.info.state, fork.info.labels], ["scratch-2", "running", { owner: "docs" }]);
          assert.deepEqual((await Sandbox.list({ labels: { owner: "docs" } })).map((s) => s.id), [fork.id]);
          assert.ok(!(await box.listCheckpoints()).some((c) => c.id === cp.id), "deleted");
        },
        () => Sandbox.create({ name: "scratch" }), // the page's `loam sandbox create scratch`
      );
    });
  });
}
