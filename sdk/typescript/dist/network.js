/**
 * A sandbox's network: `sb.network`.
 *
 * @module
 */
import { camel, sandboxPath } from "./client.js";
/**
 * The sandbox's network setting (`sb.network`), enforced on the host:
 * `egress` `"all"` (the public internet; never private, loopback or
 * link-local addresses nor the host's own, unless the deployment lists
 * them), `"none"`, or `"list"` (only what `allow` names: host names,
 * `*.` wildcards, CIDRs); `deny` wins over `allow`. Names are checked at
 * DNS and at connect (TLS SNI, HTTP Host); a refused connection fails at
 * once. Reading and changing it needs an account API key.
 *
 * @example
 * ```ts
 * await sb.network.set({ egress: "list", allow: ["pypi.org", "*.github.com"] });
 * const { usage } = await sb.network.get();
 * ```
 */
export class Network {
    client;
    sandboxId;
    /** @internal */
    constructor(client, sandboxId) {
        this.client = client;
        this.sandboxId = sandboxId;
    }
    /**
     * The setting, in its canonical form, with the traffic since the machine last started (`usage`, while it runs).
     *
     * @returns the setting and its usage
     */
    async get() {
        return camel((await this.client.call("GET", sandboxPath(this.sandboxId, "network"))).data);
    }
    /**
     * Replaces the setting, at once for new connections and DNS questions (open connections keep theirs).
     *
     * @param setting - the new setting
     * @returns the setting as {@link Network.get} shows it
     * @throws {@link StrataError} `invalid_field` (400) naming `network.egress`, `network.allow` or
     *   `network.deny` (and the rule's index); `sandbox_not_a_vm` (409) for a configured sandbox
     */
    async set(setting) {
        return camel((await this.client.call("PUT", sandboxPath(this.sandboxId, "network"), { json: setting })).data);
    }
}
//# sourceMappingURL=network.js.map