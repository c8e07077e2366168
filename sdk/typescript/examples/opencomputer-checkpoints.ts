/**
 * OpenComputer's "Checkpoints" page (`../shared/seeds/003_…`), its first
 * example, transliterated: the page's lines as written, but for what is
 * marked "changed" (docs/sdk.md, "The seeds' examples"):
 *
 * - the import: `@strata/sdk`, not `@opencomputer/sdk`;
 * - `npm install && npm run build` and `npm run test:unit|e2e` need the
 *   network (and Node.js in the guest): the machines these examples are
 *   tested on reach no such host (a sandbox reaches what its host does), so
 *   a small local project at /app (written first: the page's sandbox has
 *   its project there) stands in, built and tested with `sh`.
 *
 * The last line exports what the page makes, for the test
 * (test/examples.test.ts) to check and clean up. Run it alone:
 * `node dist-test/examples/opencomputer-checkpoints.js` with
 * CREATEOS_API_URL and CREATEOS_API_KEY set (the sandboxes it makes are
 * left running, as on the page).
 */
import { Sandbox } from "@strata/sdk"; // changed: the import

/** The local project that stands in for the page's /app (changed: no network). */
export const PROJECT =
  "mkdir -p /app && cd /app && " +
  `printf '%s\\n' 'mkdir -p dist && echo built > dist/app.txt' > build.sh && ` +
  `printf '%s\\n' 'test "$(cat dist/app.txt)" = built && echo "$1 tests pass"' > test.sh`;

const sandbox = await Sandbox.create();
await sandbox.exec.run(PROJECT); // changed: the project, written locally
await sandbox.exec.run("sh build.sh", { cwd: "/app" }); // changed: was "npm install && npm run build"

// Checkpoint after setup
const cp = await sandbox.createCheckpoint("after-build");

// Fork two independent sandboxes
const a = await Sandbox.createFromCheckpoint(cp.id);
const b = await Sandbox.createFromCheckpoint(cp.id);

await a.exec.run("sh test.sh unit", { cwd: "/app" }); // changed: was "npm run test:unit"
await b.exec.run("sh test.sh e2e", { cwd: "/app" }); // changed: was "npm run test:e2e"

export { sandbox, cp, a, b };
