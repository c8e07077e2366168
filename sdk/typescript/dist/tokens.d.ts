/**
 * Sandbox access tokens: `sb.accessToken`.
 *
 * @module
 */
import { Strata } from "./client.js";
import type { AccessToken, Scope } from "./types.js";
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
export declare class AccessTokens {
    private readonly client;
    private readonly sandboxId;
    /** @internal */
    constructor(client: Strata, sandboxId: string);
    /**
     * Issues a token; its plaintext is shown only now.
     *
     * @param options - `scopes`: what it may do (default `["checkpoints", "snapshots"]`)
     * @returns the token, its hint, creation time and scopes
     * @throws {@link StrataError} `token_exists` (409) when one is enabled; `invalid_field` (400) for
     *   an unknown scope, or `exec`/`files` on a configured sandbox
     */
    issue(options?: {
        scopes?: Scope[];
    }): Promise<AccessToken>;
    /**
     * Tells whether a token is enabled (never the token).
     *
     * @returns `enabled`, and its hint and creation time
     */
    get(): Promise<AccessToken>;
    /**
     * Replaces the token with a new one, with its scopes; the old one fails from the next request on.
     *
     * @returns the new token
     * @throws {@link StrataError} `token_not_found` (404) when none is enabled
     */
    rotate(): Promise<AccessToken>;
    /** Revokes the token (succeeds when there is none too). */
    revoke(): Promise<void>;
}
