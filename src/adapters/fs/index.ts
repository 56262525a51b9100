/** runner-depot/adapters/fs: filesystem adapters (the embedded defaults). */
export { createFsLogStore } from "./log-store.js";
export type { FsLogStoreOptions } from "./log-store.js";
export { createFsStore } from "./store.js";
export type { FsStoreOptions } from "./store.js";
