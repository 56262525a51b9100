/**
 * Imported first by every library entry point (src/index.ts, src/runner/index.ts, …): throws
 * on an unsupported Node before any other module of the package runs. The CLI has its own
 * gate (cli/node-gate.ts) that prints the message and exits instead of a stack trace.
 */
import { assertSupportedNode } from "./node-support.js";

assertSupportedNode();
