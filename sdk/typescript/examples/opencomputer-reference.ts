/**
 * OpenComputer's "Checkpoints" page, its API reference snippets (create,
 * the retention policy, list, fork, restore, delete), one after the other
 * as the page gives them, transliterated (docs/sdk.md, "The seeds'
 * examples"). Changed: the import. Added, marked so: the sandbox the
 * snippets use (`sandbox`) and the id they name (`checkpointId`), and a
 * block around the second snippet, which names its result `checkpoint`
 * as the first does. Exports what it makes, for test/examples.test.ts.
 */
import { Sandbox } from "@strata/sdk"; // changed: the import

const sandbox = await Sandbox.create(); // added: the sandbox the snippets use

// Create Checkpoint
const checkpoint = await sandbox.createCheckpoint("before-migration");
// checkpoint.id, checkpoint.status ("processing" → "ready")

{
  // added: a block, the snippet's `checkpoint` is another
  const checkpoint = await sandbox.createCheckpoint("autosave", {
    kind: "disk_only",
    retentionPolicy: { mode: "delete_oldest", maxCount: 100 },
  });
  void checkpoint;
}

// List Checkpoints
const checkpoints = await sandbox.listCheckpoints();

const checkpointId = checkpoint.id; // added: the id the snippets name

// Fork from Checkpoint
const forked = await Sandbox.createFromCheckpoint(checkpointId, {
  timeout: 600,
});

// Restore Checkpoint
await sandbox.restoreCheckpoint(checkpointId);

// Delete Checkpoint
await sandbox.deleteCheckpoint(checkpointId);

export { sandbox, checkpoint, checkpoints, forked };
