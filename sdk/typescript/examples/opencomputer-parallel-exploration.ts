/**
 * OpenComputer's "Checkpoints" page, "Example: Parallel Exploration",
 * transliterated (docs/sdk.md, "The seeds' examples"). Changed: the
 * import, and the clone of `https://github.com/user/repo`: the machines
 * these examples are tested on reach no such host, so a local repository
 * (made first, in the sandbox)
 * stands in, cloned the same way. The page's merges run as written: right
 * after a clone there is nothing to merge (`Already up to date.`, exit 0),
 * and git has no strategy `theirs` (exit 1). Exports the page's values,
 * for test/examples.test.ts.
 */
import { Sandbox } from "@strata/sdk"; // changed: the import

/** The repository the page clones, made locally (changed: no network). */
export const REPOSITORY =
  "git init -q -b main /srv/repo && git -C /srv/repo -c user.name=example -c user.email=example@localhost commit -q --allow-empty -m init";

const sandbox = await Sandbox.create();
await sandbox.exec.run(REPOSITORY); // changed: the repository, made locally
await sandbox.exec.run("git clone /srv/repo /app"); // changed: was "git clone https://github.com/user/repo /app"
const cp = await sandbox.createCheckpoint("fresh-clone");

// Try three different migration strategies in parallel
const strategies = ["--strategy=ours", "--strategy=theirs", "--strategy=recursive"];
const results = await Promise.all(
  strategies.map(async (strategy) => {
    const fork = await Sandbox.createFromCheckpoint(cp.id);
    const result = await fork.exec.run(`cd /app && git merge origin/main ${strategy}`);
    await fork.kill();
    return { strategy, exitCode: result.exitCode };
  }),
);

export { sandbox, cp, results };
