/**
 * Sandbox access tokens: `sb.accessToken`.
 *
 * @module
 */
import { Strata, camel, sandboxPath } from "./client.js";
import type { AccessToken } from "./types.js";

/**
 * The sandbox's access token (`sb.accessToken`): a key that acts only on
 * this sandbox's checkpoints, files, sessions and some snapshot routes.
 * Managing it needs an account API key.
 *
 * @example
 * ```ts
 * const { token } = await sb.accessToken.issue();
 * const inside = new Strata({ apiUrl, apiKey: token });
 * ```
 */
export class AccessTokens {
  /** @internal */
  constructor(
    private readonly client: Strata,
    private readonly sandboxId: string,
  ) {}

  /**
   * Issues a token; its plaintext is shown only now.
   *
   * @returns the token, its hint and creation time
   * @throws {@link StrataError} `token_exists` (409) when one is enabled
   */
  async issue(): Promise<AccessToken> {
    return camel((await this.client.call("POST", sandboxPath(this.sandboxId, "access-token"))).data);
  }

  /**
   * Tells whether a token is enabled (never the token).
   *
   * @returns `enabled`, and its hint and creation time
   */
  async get(): Promise<AccessToken> {
    return camel((await this.client.call("GET", sandboxPath(this.sandboxId, "access-token"))).data);
  }

  /**
   * Replaces the token with a new one; the old one fails from the next request on.
   *
   * @returns the new token
   * @throws {@link StrataError} `token_not_found` (404) when none is enabled
   */
  async rotate(): Promise<AccessToken> {
    return camel((await this.client.call("POST", sandboxPath(this.sandboxId, "access-token", "rotate"))).data);
  }

  /** Revokes the token (succeeds when there is none too). */
  async revoke(): Promise<void> {
    await this.client.call("DELETE", sandboxPath(this.sandboxId, "access-token"));
  }
}
