/**
 * The stand-in VM's agent for examples/orchestrator-loop.ts: what `runner-depot agent`
 * does inside a real VM, written out with the library's three calls.
 *
 *   node --import tsx examples/orchestrator-loop/vm-agent.ts --config <job.json>
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import { createRunnerClient, readJobConfig, runJob } from "runner-depot/runner";

const at = process.argv.indexOf("--config");
const job = await readJobConfig(at === -1 ? undefined : process.argv[at + 1]);
const client = createRunnerClient({ endpoint: job.endpoint, requestId: job.requestId, token: job.token });
const exitCode = await runJob(client, {
  command: job.command,
  args: job.args,
  cwd: job.cwd,
  env: { ...process.env, ...job.env },
  repoUrl: job.repoUrl,
  commitSha: job.commitSha,
});
await client.close();
console.log(`vm-agent: job ${job.requestId} exited ${exitCode}; its end is acknowledged`);
