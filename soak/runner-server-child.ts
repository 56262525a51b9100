/**
 * The runner server that soak/runner-kill.ts kills with SIGKILL and starts again: an fs
 * log store in `dir`, a queue that appends each result to `results` (one JSON line,
 * fdatasync'd before the publish counts as accepted, like a broker's confirm), a fixed
 * port. Prints "ready" once listening. Arguments: <dir> <port> <results file> <secret>.
 */
import { open } from "node:fs/promises";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { createRunnerService, startRunnerServer, type JobResult } from "../src/runner/index.js";

const [dir, portText, resultsFile, secret] = process.argv.slice(2) as [string, string, string, string];

const results = await open(resultsFile, "a");
const queue = {
  async publishJobResult(result: JobResult): Promise<void> {
    await results.write(`${JSON.stringify(result)}\n`);
    await results.datasync();
  },
};
const runner = createRunnerService(queue, { secret, logs: createFsLogStore(dir) });
// The previous process's socket may linger a moment after SIGKILL.
for (let attempt = 0; ; attempt++) {
  try {
    await startRunnerServer(runner, { port: Number(portText) });
    break;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EADDRINUSE" || attempt > 200) throw error;
    await new Promise((r) => setTimeout(r, 25));
  }
}
process.stdout.write("ready\n");
