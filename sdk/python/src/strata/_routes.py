"""Which SDK method reaches which API route ("one description, three clients").

``ROUTES`` maps each public method (by its qualified name in ``strata``) to
the routes (method, path template of hostproxy/openapi.json) it calls. A
test checks it both ways against openapi.json: every route of the API is
reached by some method, and every route named here exists. Left out as not
SDK calls: ``GET /metrics`` (Prometheus, for operators), ``GET /v1/health``
(a liveness probe) and ``GET /v1/openapi.json`` (this description itself).
"""

from __future__ import annotations

NON_SDK_ROUTES: frozenset[tuple[str, str]] = frozenset(
    {("GET", "/metrics"), ("GET", "/v1/health"), ("GET", "/v1/openapi.json")}
)

S = "/v1/sandboxes/{id}"

ROUTES: dict[str, list[tuple[str, str]]] = {
    # sandboxes
    "Sandbox.create": [("POST", "/v1/sandboxes"), ("GET", S)],
    "Sandbox.create_from_checkpoint": [("POST", "/v1/sandboxes"), ("GET", S)],
    "Sandbox.list": [("GET", "/v1/sandboxes")],
    "Sandbox.refresh": [("GET", S)],
    "Sandbox.wait_until": [("GET", S)],
    "Sandbox.kill": [("DELETE", S)],
    "Sandbox.set_access": [("PUT", S + "/access")],
    "Sandbox.set_labels": [("PUT", S + "/labels")],
    "Network.get": [("GET", S + "/network")],
    "Network.set": [("PUT", S + "/network")],
    "Sandbox.pause": [("POST", S + "/pause"), ("GET", S)],
    "Sandbox.resume": [("POST", S + "/resume"), ("GET", S)],
    "Sandbox.stop": [("POST", S + "/stop")],
    "Sandbox.start": [("POST", S + "/start"), ("GET", S)],
    "Sandbox.fork": [("POST", "/v1/sandboxes"), ("POST", S + "/snapshots/{snapshot}/fork"), ("GET", S)],
    # exec and sessions
    "Exec.run": [("POST", S + "/exec")],
    "Exec.start": [("POST", S + "/sessions"), ("GET", S + "/sessions/{sid}/attach")],
    "Exec.attach": [("GET", S + "/sessions/{sid}"), ("GET", S + "/sessions/{sid}/attach")],
    "Exec.list": [("GET", S + "/sessions")],
    "Exec.get": [("GET", S + "/sessions/{sid}")],
    "Exec.kill": [("DELETE", S + "/sessions/{sid}")],
    "Session.kill": [("DELETE", S + "/sessions/{sid}")],
    "Session.reattach": [("GET", S + "/sessions/{sid}/attach")],
    # files
    "Files.write": [("PUT", S + "/files/{path}")],
    "Files.write_stream": [("PUT", S + "/files/{path}")],
    "Files.read": [("GET", S + "/files/{path}")],
    "Files.read_text": [("GET", S + "/files/{path}")],
    "Files.read_stream": [("GET", S + "/files/{path}")],
    "Files.list": [("GET", S + "/files/{path}"), ("GET", S + "/files")],
    "Files.stat": [("HEAD", S + "/files/{path}"), ("HEAD", S + "/files")],
    "Files.exists": [("HEAD", S + "/files/{path}")],
    "Files.remove": [("DELETE", S + "/files/{path}"), ("DELETE", S + "/files")],
    "Files.upload": [("PUT", S + "/files/{path}"), ("PUT", S + "/files")],
    "Files.download": [("GET", S + "/files/{path}"), ("GET", S + "/files")],
    # directory checkpoints
    "Checkpoints.create": [("POST", S + "/checkpoints")],
    "Checkpoints.list": [("GET", S + "/checkpoints")],
    "Checkpoints.restore": [("POST", S + "/checkpoints/{checkpoint}/restore")],
    "Checkpoints.delete": [("DELETE", S + "/checkpoints/{checkpoint}")],
    "Checkpoints.changes": [("GET", S + "/checkpoints/{checkpoint}/changes")],
    "Checkpoints.stat_file": [("GET", S + "/checkpoints/{checkpoint}/files/{path}"), ("GET", S + "/checkpoints/{checkpoint}/files")],
    "Checkpoints.read_file": [("GET", S + "/checkpoints/{checkpoint}/files/{path}")],
    "Checkpoints.list_files": [("GET", S + "/checkpoints/{checkpoint}/files/{path}"), ("GET", S + "/checkpoints/{checkpoint}/files")],
    "Checkpoints.restore_paths": [("POST", S + "/checkpoints/{checkpoint}/restore-paths")],
    "Checkpoints.clone": [("POST", S + "/checkpoints/{checkpoint}/clone")],
    "Checkpoints.directories": [("GET", S + "/directories")],
    "Checkpoints.release": [("POST", S + "/directories/release")],
    # VM snapshots
    "Snapshots.create": [("POST", S + "/snapshots")],
    "Snapshots.list": [("GET", S + "/snapshots")],
    "Snapshots.get": [("GET", S + "/snapshots/{snapshot}")],
    "Snapshots.restore": [("POST", S + "/snapshots/{snapshot}/restore"), ("GET", S)],
    "Snapshots.delete": [("DELETE", S + "/snapshots/{snapshot}")],
    "Snapshots.pin": [("POST", S + "/snapshots/{snapshot}/pin")],
    "Snapshots.unpin": [("POST", S + "/snapshots/{snapshot}/unpin")],
    "Sandbox.create_checkpoint": [("POST", S + "/snapshots")],
    "Sandbox.list_checkpoints": [("GET", S + "/snapshots")],
    "Sandbox.restore_checkpoint": [("POST", S + "/snapshots/{snapshot}/restore"), ("GET", S)],
    "Sandbox.delete_checkpoint": [("DELETE", S + "/snapshots/{snapshot}")],
    # access tokens
    "AccessToken.issue": [("POST", S + "/access-token")],
    "AccessToken.get": [("GET", S + "/access-token")],
    "AccessToken.rotate": [("POST", S + "/access-token/rotate")],
    "AccessToken.revoke": [("DELETE", S + "/access-token")],
}


def all_routes() -> set[tuple[str, str]]:
    """Every route some SDK method reaches."""
    return {r for routes in ROUTES.values() for r in routes}
