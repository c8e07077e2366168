/**
 * The records of the API, with camelCase keys.
 *
 * @module
 */
export {};
//# sourceMappingURL=types.js.map