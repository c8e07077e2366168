// "One description, three clients": every route of hostproxy/openapi.json
// is reached by some SDK method (ROUTES), and ROUTES names no route the
// document lacks. GET /v1/health, GET /v1/openapi.json and GET /metrics are
// the service's own, not SDK operations (see ROUTES).
import { test } from "node:test";
import assert from "node:assert/strict";
import { ROUTES } from "@strata/sdk";
import { NON_SDK, documentRoutes } from "./openapi.js";


test("every route of openapi.json is reached by an SDK method", () => {
  const doc = documentRoutes();
  const reached = new Set(Object.values(ROUTES).flat());
  const missing = [...doc].filter((r) => !NON_SDK.has(r) && !reached.has(r));
  assert.deepEqual(missing, [], `routes no SDK method reaches: ${missing.join(", ")}`);
});

test("every route in ROUTES is in openapi.json", () => {
  const doc = documentRoutes();
  const unknown = Object.entries(ROUTES).flatMap(([m, rs]) => rs.filter((r) => !doc.has(r)).map((r) => `${m}: ${r}`));
  assert.deepEqual(unknown, [], `ROUTES names routes the document lacks: ${unknown.join(", ")}`);
  for (const r of NON_SDK) assert.ok(doc.has(r), `${r} is no longer in the document`);
});
