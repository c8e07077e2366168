// The routes of hostproxy/openapi.json, for the tests.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** Routes of the service itself, not SDK operations: health, the description, metrics. */
export const NON_SDK = new Set(["GET /v1/health", "GET /v1/openapi.json", "GET /metrics"]);

/** The routes of the document, "METHOD /path/{param}". */
export function documentRoutes(): Set<string> {
  const file = fileURLToPath(new URL("../../../../hostproxy/openapi.json", import.meta.url));
  const doc = JSON.parse(readFileSync(file, "utf8")) as { paths: Record<string, Record<string, unknown>> };
  const out = new Set<string>();
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const m of Object.keys(ops)) {
      if (["get", "put", "post", "delete", "head", "patch"].includes(m)) out.add(`${m.toUpperCase()} ${path}`);
    }
  }
  return out;
}

