/** What an attachment's connection calls. @internal */
export interface WsHandlers {
    /** A text frame. */
    text(s: string): void;
    /** A binary frame. */
    binary(b: Uint8Array): void;
    /** The end, with its close code and reason (1006 when the connection broke). */
    close(code: number, reason: string): void;
}
/** An open attachment. @internal */
export interface WsConn {
    /** Sends a frame; false when the connection is no longer open (nothing sent). */
    send(data: string | Uint8Array): boolean;
    /** Closes it. */
    close(code?: number, reason?: string): void;
    /**
     * Stops reading from the connection (back-pressure: the server's
     * writes wait, and it keeps the output); false when the transport
     * cannot (the platform's WebSocket has no flow control).
     */
    pause(): boolean;
    /** Reads again after {@link WsConn.pause}. */
    resume(): void;
}
/** How long the opening handshake of an attachment may take, in ms. */
export declare const HANDSHAKE_TIMEOUT_MS = 30000;
/**
 * Opens url (ws:// or wss://) with key. The platform's WebSocket cannot
 * send headers, so the key goes as a subprotocol `key.<key>` (the server
 * answers `strata.v1`); `ws` sends it as `X-Api-Key`. A refusal before the
 * upgrade is a StrataError from its JSend answer with `ws`; with the
 * platform's WebSocket, whose failures say nothing, `network_error`.
 * @internal
 */
export declare function openWs(url: string, key: string, h: WsHandlers): Promise<WsConn>;
