/**
 * Sandbox access tokens: `sb.accessToken`.
 *
 * @module
 */
import { camel, sandboxPath } from "./client.js";
/**
 * The sandbox's access token (`sb.accessToken`): a key that acts only on
 * this sandbox, within its scopes (by default `checkpoints` and
 * `snapshots`; `exec` and `files` when issued with them). Managing it
 * needs an account API key.
 *
 * @example
 * ```ts
 * const { token } = await sb.accessToken.issue({ scopes: ["checkpoints", "exec"] });
 * const inside = new Strata({ apiUrl, apiKey: token });
 * ```
 */
export class AccessTokens {
    client;
    sandboxId;
    /** @internal */
    constructor(client, sandboxId) {
        this.client = client;
        this.sandboxId = sandboxId;
    }
    /**
     * Issues a token; its plaintext is shown only now.
     *
     * @param options - `scopes`: what it may do (default `["checkpoints", "snapshots"]`)
     * @returns the token, its hint, creation time and scopes
     * @throws {@link StrataError} `token_exists` (409) when one is enabled; `invalid_field` (400) for
     *   an unknown scope, or `exec`/`files` on a configured sandbox
     */
    async issue(options = {}) {
        const json = options.scopes === undefined ? undefined : { scopes: options.scopes };
        return camel((await this.client.call("POST", sandboxPath(this.sandboxId, "access-token"), { json })).data);
    }
    /**
     * Tells whether a token is enabled (never the token).
     *
     * @returns `enabled`, and its hint and creation time
     */
    async get() {
        return camel((await this.client.call("GET", sandboxPath(this.sandboxId, "access-token"))).data);
    }
    /**
     * Replaces the token with a new one, with its scopes; the old one fails from the next request on.
     *
     * @returns the new token
     * @throws {@link StrataError} `token_not_found` (404) when none is enabled
     */
    async rotate() {
        return camel((await this.client.call("POST", sandboxPath(this.sandboxId, "access-token", "rotate"))).data);
    }
    /** Revokes the token (succeeds when there is none too). */
    async revoke() {
        await this.client.call("DELETE", sandboxPath(this.sandboxId, "access-token"));
    }
}
//# sourceMappingURL=tokens.js.map