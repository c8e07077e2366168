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
export declare const ROUTES: Readonly<Record<string, readonly string[]>>;
