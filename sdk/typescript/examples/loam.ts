/**
 * loam's "Checkpoints" page (`../shared/seeds/000_…`), its TypeScript
 * lines, transliterated (docs/sdk.md, "The seeds' examples"). Changed:
 * the import, and loam's client object, which this SDK does not have:
 * `loam.sandbox('scratch')` is `await Sandbox.connect('scratch')` (a
 * sandbox by its name, as loam's), and `loam.fork('scratch', cp.id, …)` is
 * `box.fork(cp.id, …)`. The page's sandbox `scratch` must exist (the test
 * makes it, as the page's `loam sandbox create scratch`). Exports what it
 * makes, for test/examples.test.ts.
 */
import { Sandbox } from "@strata/sdk"; // changed: the import

const box = await Sandbox.connect("scratch"); // changed: was loam.sandbox('scratch')
const cp = await box.createCheckpoint({ comment: "before upgrade" }); // memory: true by default
await box.restoreCheckpoint(cp.id);
const fork = await box.fork(cp.id, { name: "scratch-2", labels: { owner: "docs" } }); // changed: was loam.fork('scratch', cp.id, …)
await box.deleteCheckpoint(cp.id);

export { box, cp, fork };
