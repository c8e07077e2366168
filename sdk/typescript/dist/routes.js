/**
 * The routes each SDK method calls.
 *
 * @module
 */
/**
 * The routes (method and path template of `hostproxy/openapi.json`) each
 * method of the SDK calls, by `Class.method`. The tests check it against
 * the OpenAPI document both ways: every route of the API is reached by
 * some method, and every route here is in the document. `GET /v1/health`,
 * `GET /v1/openapi.json` and `GET /metrics` are left out on purpose: they
 * are the service's own (monitoring, the description itself), not
 * operations on sandboxes.
 */
export const ROUTES = {
    "Sandbox.create": ["POST /v1/sandboxes", "GET /v1/sandboxes/{id}"],
    "Sandbox.connect": ["GET /v1/sandboxes/{id}"],
    "Sandbox.list": ["GET /v1/sandboxes"],
    "Sandbox.createFromCheckpoint": ["POST /v1/sandboxes", "GET /v1/sandboxes/{id}"],
    "Sandbox.fork": ["POST /v1/sandboxes", "POST /v1/sandboxes/{id}/snapshots/{snapshot}/fork", "GET /v1/sandboxes/{id}"],
    "Sandbox.refresh": ["GET /v1/sandboxes/{id}"],
    "Sandbox.waitFor": ["GET /v1/sandboxes/{id}"],
    "Sandbox.kill": ["DELETE /v1/sandboxes/{id}"],
    "Sandbox.setAccess": ["PUT /v1/sandboxes/{id}/access"],
    "Sandbox.setLabels": ["PUT /v1/sandboxes/{id}/labels"],
    "Network.get": ["GET /v1/sandboxes/{id}/network"],
    "Network.set": ["PUT /v1/sandboxes/{id}/network"],
    "Sandbox.pause": ["POST /v1/sandboxes/{id}/pause", "GET /v1/sandboxes/{id}"],
    "Sandbox.resume": ["POST /v1/sandboxes/{id}/resume", "GET /v1/sandboxes/{id}"],
    "Sandbox.stop": ["POST /v1/sandboxes/{id}/stop"],
    "Sandbox.start": ["POST /v1/sandboxes/{id}/start", "GET /v1/sandboxes/{id}"],
    "Sandbox.createCheckpoint": ["POST /v1/sandboxes/{id}/snapshots"],
    "Sandbox.listCheckpoints": ["GET /v1/sandboxes/{id}/snapshots"],
    "Sandbox.restoreCheckpoint": ["POST /v1/sandboxes/{id}/snapshots/{snapshot}/restore", "GET /v1/sandboxes/{id}"],
    "Sandbox.deleteCheckpoint": ["DELETE /v1/sandboxes/{id}/snapshots/{snapshot}"],
    "Exec.run": ["POST /v1/sandboxes/{id}/exec"],
    "Exec.start": ["POST /v1/sandboxes/{id}/sessions", "GET /v1/sandboxes/{id}/sessions/{sid}/attach", "GET /v1/sandboxes/{id}/sessions/{sid}"],
    "Exec.attach": ["GET /v1/sandboxes/{id}/sessions/{sid}/attach", "GET /v1/sandboxes/{id}/sessions/{sid}"],
    "Exec.list": ["GET /v1/sandboxes/{id}/sessions"],
    "Exec.get": ["GET /v1/sandboxes/{id}/sessions/{sid}"],
    "Exec.kill": ["DELETE /v1/sandboxes/{id}/sessions/{sid}"],
    "Session.kill": ["DELETE /v1/sandboxes/{id}/sessions/{sid}"],
    "Files.write": ["PUT /v1/sandboxes/{id}/files/{path}"],
    "Files.writeStream": ["PUT /v1/sandboxes/{id}/files/{path}"],
    "Files.read": ["GET /v1/sandboxes/{id}/files/{path}"],
    "Files.readText": ["GET /v1/sandboxes/{id}/files/{path}"],
    "Files.readStream": ["GET /v1/sandboxes/{id}/files/{path}"],
    "Files.list": ["GET /v1/sandboxes/{id}/files/{path}", "GET /v1/sandboxes/{id}/files"],
    "Files.remove": ["DELETE /v1/sandboxes/{id}/files/{path}", "DELETE /v1/sandboxes/{id}/files"],
    "Files.stat": ["HEAD /v1/sandboxes/{id}/files/{path}", "HEAD /v1/sandboxes/{id}/files"],
    "Files.exists": ["HEAD /v1/sandboxes/{id}/files/{path}", "HEAD /v1/sandboxes/{id}/files"],
    "Files.upload": ["PUT /v1/sandboxes/{id}/files/{path}", "PUT /v1/sandboxes/{id}/files"],
    "Files.download": ["GET /v1/sandboxes/{id}/files/{path}", "GET /v1/sandboxes/{id}/files"],
    "Checkpoints.create": ["POST /v1/sandboxes/{id}/checkpoints"],
    "Checkpoints.list": ["GET /v1/sandboxes/{id}/checkpoints"],
    "Checkpoints.restore": ["POST /v1/sandboxes/{id}/checkpoints/{checkpoint}/restore"],
    "Checkpoints.delete": ["DELETE /v1/sandboxes/{id}/checkpoints/{checkpoint}"],
    "Checkpoints.changes": ["GET /v1/sandboxes/{id}/checkpoints/{checkpoint}/changes"],
    "Checkpoints.entry": ["GET /v1/sandboxes/{id}/checkpoints/{checkpoint}/files/{path}", "GET /v1/sandboxes/{id}/checkpoints/{checkpoint}/files"],
    "Checkpoints.readFile": ["GET /v1/sandboxes/{id}/checkpoints/{checkpoint}/files/{path}"],
    "Checkpoints.listFiles": ["GET /v1/sandboxes/{id}/checkpoints/{checkpoint}/files/{path}", "GET /v1/sandboxes/{id}/checkpoints/{checkpoint}/files"],
    "Checkpoints.restorePaths": ["POST /v1/sandboxes/{id}/checkpoints/{checkpoint}/restore-paths"],
    "Checkpoints.clone": ["POST /v1/sandboxes/{id}/checkpoints/{checkpoint}/clone"],
    "Checkpoints.directories": ["GET /v1/sandboxes/{id}/directories"],
    "Checkpoints.release": ["POST /v1/sandboxes/{id}/directories/release"],
    "Snapshots.create": ["POST /v1/sandboxes/{id}/snapshots"],
    "Snapshots.list": ["GET /v1/sandboxes/{id}/snapshots"],
    "Snapshots.get": ["GET /v1/sandboxes/{id}/snapshots/{snapshot}"],
    "Snapshots.restore": ["POST /v1/sandboxes/{id}/snapshots/{snapshot}/restore", "GET /v1/sandboxes/{id}"],
    "Snapshots.delete": ["DELETE /v1/sandboxes/{id}/snapshots/{snapshot}"],
    "Snapshots.pin": ["POST /v1/sandboxes/{id}/snapshots/{snapshot}/pin"],
    "Snapshots.unpin": ["POST /v1/sandboxes/{id}/snapshots/{snapshot}/unpin"],
    "AccessTokens.issue": ["POST /v1/sandboxes/{id}/access-token"],
    "AccessTokens.get": ["GET /v1/sandboxes/{id}/access-token"],
    "AccessTokens.rotate": ["POST /v1/sandboxes/{id}/access-token/rotate"],
    "AccessTokens.revoke": ["DELETE /v1/sandboxes/{id}/access-token"],
};
//# sourceMappingURL=routes.js.map