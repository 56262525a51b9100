/**
 * The CLI's first import (main.ts): on an unsupported Node it prints why and how to get a
 * supported one, and exits 1 before any other module loads (an old Node otherwise started
 * `serve`, printed its banner, and answered every depot request with 500).
 */
import { unsupportedNode } from "../node-support.js";

const why = unsupportedNode();
if (why !== undefined) {
  process.stderr.write(`${why}\n`);
  process.exit(1);
}
