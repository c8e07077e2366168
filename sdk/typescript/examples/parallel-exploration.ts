/**
 * The seeds' "parallel exploration": try several approaches from the same
 * starting point. One sandbox, a command that sets the starting point up,
 * a VM snapshot of it (the seeds' `createCheckpoint`), three forks of that
 * snapshot, a different command in each, the results gathered, the forks
 * killed.
 *
 * Run it: `node dist-test/examples/parallel-exploration.js` (with
 * CREATEOS_API_URL and CREATEOS_API_KEY set).
 */
import { pathToFileURL } from "node:url";
import { Sandbox } from "@strata/sdk";

/** What one approach gave. */
export interface ExplorationResult {
  strategy: string;
  exitCode: number;
  stdout: string;
}

/** Options of {@link parallelExploration}. */
export interface ExplorationOptions {
  /** Start from this sandbox (default: a new one, killed at the end). */
  sandbox?: Sandbox;
  /** The snapshot's name (default "fresh-clone"); null: no name. */
  checkpointName?: string | null;
  /** Forks alive at once (default 3: all in parallel). */
  maxParallel?: number;
  /** Prefix of the forks' names. */
  namePrefix?: string;
}

/** Runs items through fn, at most limit at once, keeping their order. */
async function mapLimited<T, R>(items: T[], limit: number, fn: (item: T, i: number) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/** The example itself. */
export async function parallelExploration(options: ExplorationOptions = {}): Promise<ExplorationResult[]> {
  const sandbox = options.sandbox ?? (await Sandbox.create());
  try {
    // The starting point: a small "repository".
    await sandbox.exec.run("mkdir -p /app && cd /app && printf '3\\n1\\n2\\n' > data.txt && echo ready > state");

    // A VM snapshot (the seeds call it a checkpoint): disk and memory.
    const name = options.checkpointName === undefined ? "fresh-clone" : options.checkpointName;
    const cp = await sandbox.createCheckpoint(name ?? undefined);

    // Three approaches, each in its own fork of that snapshot.
    const strategies = ["sort -n data.txt", "sort -rn data.txt", "wc -l < data.txt"];
    const results = await mapLimited(strategies, options.maxParallel ?? strategies.length, async (strategy, i) => {
      const fork = await Sandbox.createFromCheckpoint(cp, { name: options.namePrefix ? `${options.namePrefix}-${i + 1}` : undefined });
      try {
        const result = await fork.exec.run(strategy, { cwd: "/app" });
        return { strategy, exitCode: result.exitCode, stdout: result.stdout };
      } finally {
        await fork.kill();
      }
    });
    await sandbox.deleteCheckpoint(cp.id);
    return results;
  } finally {
    if (!options.sandbox) await sandbox.kill();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  for (const r of await parallelExploration()) console.log(`${r.strategy}: exit ${r.exitCode}\n${r.stdout}`);
}
