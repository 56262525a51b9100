/**
 * An orchestrator's loop end to end: render cloud-init for a job, boot a stand-in "VM"
 * (a child process that runs what the user data says), follow the job's live log, and
 * consume its result from RabbitMQ.
 *
 *   npx tsx examples/orchestrator-loop.ts
 *
 * Needs RabbitMQ at AMQP_URL (default amqp://guest:guest@127.0.0.1:5672). Uses a fresh
 * queue per run and deletes it afterwards. Exits 1 unless the job finished and the VM's
 * agent exited 0.
 *
 * Imports go to the package's source by relative path: `runner-depot` itself only
 * resolves after a build and an install (in a host: `from "runner-depot/runner"` and
 * `from "runner-depot/adapters/rabbitmq"`).
 */
import { spawn } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import amqp from "amqplib";
import { parse as parseYaml } from "yaml";
import { createRabbitMqQueue, JOB_RESULT_MESSAGE_TYPE } from "runner-depot/adapters/rabbitmq";
import { createRunnerService, mintJobToken, renderCloudInit, startRunnerServer } from "runner-depot/runner";
import type { JobResult } from "runner-depot/runner";

const AMQP_URL = process.env.AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672";
const here = dirname(fileURLToPath(import.meta.url));

// --- the orchestrator's side -------------------------------------------------------
const secret = randomBytes(32);
const queueName = `runner-depot.example.${randomUUID()}`;
// x-expires: should this run die half-way, the broker drops its queue after a minute unused.
const queueArguments = { "x-expires": 60_000 };
const queue = createRabbitMqQueue({ url: AMQP_URL, queue: queueName, queueArguments });
await queue.ready(5000);
const runner = createRunnerService(queue, { secret, requireKnownJobs: true });
const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
console.log(`orchestrator-loop: runner service on ${server.url}, results to RabbitMQ queue ${queueName}`);

// A consumer, as the integration layer would run it: dedupe on messageId, ack after use.
const amqpConnection = await amqp.connect(AMQP_URL);
const channel = await amqpConnection.createChannel();
await channel.assertQueue(queueName, { durable: true, arguments: queueArguments });
const results = new Map<string, (result: JobResult) => void>();
await channel.consume(queueName, (message) => {
  if (!message) return;
  const result = JSON.parse(message.content.toString("utf8")) as JobResult;
  console.log(
    `orchestrator-loop: consumed ${message.properties.type} messageId=${message.properties.messageId} ` +
      `persistent=${message.properties.deliveryMode === 2} outcome=${result.outcome} exitCode=${result.exitCode}`,
  );
  if (message.properties.type === JOB_RESULT_MESSAGE_TYPE) results.get(message.properties.messageId)?.(result);
  channel.ack(message);
});

// --- launch a job -----------------------------------------------------------------
const requestId = randomUUID();
const repoUrl = "https://example.org/app.git";
const commitSha = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
await runner.expectJob(requestId, { repoUrl, commitSha });
const resultArrived = new Promise<JobResult>((resolve) => results.set(requestId, resolve));

const vmRoot = await mkdtemp(join(tmpdir(), "runner-depot-vm-"));
const userData = renderCloudInit({
  endpoint: server.url,
  requestId,
  token: mintJobToken(secret, requestId),
  repoUrl,
  commitSha,
  // The job: a few lines on stdout and stderr, then exit 0.
  command: [
    process.execPath,
    "-e",
    "for (const s of ['checkout', 'build', 'test']) console.log('step ' + s); console.error('1 warning'); console.log('all green')",
  ],
  agentCommand: [process.execPath, "--import", "tsx", join(here, "orchestrator-loop", "vm-agent.ts")],
  configPath: join(vmRoot, "etc", "runner-depot", "job.json"),
});
console.log(`orchestrator-loop: rendered ${userData.split("\n").length} lines of cloud-init user data`);

// --- the stand-in VM: do what cloud-init would do with that user data ---------------
const cloudConfig = parseYaml(userData) as {
  write_files: Array<{ path: string; permissions: string; content: string }>;
  runcmd: string[][];
};
for (const file of cloudConfig.write_files) {
  await mkdir(dirname(file.path), { recursive: true });
  await writeFile(file.path, file.content, { mode: Number.parseInt(file.permissions, 8) });
}
const [argv0, ...argv] = cloudConfig.runcmd[0]!;
const vm = spawn(argv0!, argv, { stdio: ["ignore", "inherit", "inherit"] });
const vmExit = new Promise<number | null>((resolve) => vm.once("exit", (code) => resolve(code)));

// --- follow the live log until the job ends ------------------------------------------
let followed = 0;
for await (const line of runner.follow(requestId)) {
  followed++;
  console.log(`orchestrator-loop: [${requestId.slice(0, 8)} ${line.stderr ? "stderr" : "stdout"}] ${line.line}`);
}
const result = await resultArrived;
const vmCode = await vmExit;
console.log(
  `orchestrator-loop: followed ${followed} lines; result ${result.outcome} success=${result.success} ` +
    `lines=${JSON.stringify(result.lines)} commit=${result.commitSha.slice(0, 7)}; VM exited ${vmCode}`,
);

// --- shut down ------------------------------------------------------------------------
await channel.deleteQueue(queueName);
await channel.close();
await amqpConnection.close();
await server.close();
await runner.close();
await queue.close();
await rm(vmRoot, { recursive: true, force: true });
if (vmCode !== 0 || result.outcome !== "finished") process.exit(1);
console.log("orchestrator-loop: done");
