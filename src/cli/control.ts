/**
 * The control API `serve` adds under `/-/` on the depot's port, for the `job` and
 * `logs` commands: create a job (mint its token, register it, render its cloud-init)
 * and read or follow its log. Every request needs the admin token.
 */
import { timingSafeEqual } from "node:crypto";
import { v4 as uuidv4 } from "uuid";
import { RunnerDepotError } from "../errors.js";
import { mintJobToken, normalizeRequestId, renderCloudInit, type RunnerService } from "../runner/index.js";
import type { JobLogStore } from "../runner/ports.js";

/** What the control API needs from `serve`. */
export interface ControlApiOptions {
  runner: RunnerService;
  logs: JobLogStore;
  secret: string;
  adminToken: string;
  /** The runner URL as VMs reach it. */
  runnerUrl: string;
}

/** The body of `POST /-/jobs`. */
export interface CreateJobRequest {
  command: string[];
  repoUrl?: string;
  commitSha?: string;
}

/** The answer of `POST /-/jobs`. */
export interface CreateJobResponse {
  requestId: string;
  token: string;
  endpoint: string;
  userData: string;
}

/** Builds the control API's fetch handler. */
export function createControlApi(options: ControlApiOptions): (request: Request) => Promise<Response> {
  const expected = Buffer.from(`Bearer ${options.adminToken}`);
  return async (request) => {
    try {
      const given = Buffer.from(request.headers.get("authorization") ?? "");
      if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
        throw new RunnerDepotError("UNAUTHENTICATED", "the control API needs the admin token (Authorization: Bearer …)");
      }
      const url = new URL(request.url);
      if (request.method === "POST" && url.pathname === "/-/jobs") return await createJob(await request.json());
      const match = /^\/-\/jobs\/([^/]+)\/log$/.exec(url.pathname);
      if (request.method === "GET" && match) return await jobLog(match[1]!, url.searchParams.has("follow"), request.signal);
      throw new RunnerDepotError("NOT_FOUND", `no control route ${request.method} ${url.pathname}`);
    } catch (error) {
      const problem = RunnerDepotError.from(error).toProblem();
      return Response.json(problem, { status: problem.status, headers: { "content-type": "application/problem+json" } });
    }
  };

  async function createJob(body: unknown): Promise<Response> {
    const job = body as Partial<CreateJobRequest>;
    if (!Array.isArray(job.command) || job.command.length === 0 || !job.command.every((part) => typeof part === "string")) {
      throw new RunnerDepotError("INVALID_ARGUMENT", "command must be a non-empty array of strings");
    }
    const requestId = uuidv4();
    const token = mintJobToken(options.secret, requestId);
    const repoUrl = job.repoUrl ?? "";
    const commitSha = job.commitSha ?? "";
    await options.runner.expectJob(requestId, { repoUrl, commitSha });
    const userData = renderCloudInit({ endpoint: options.runnerUrl, requestId, token, repoUrl, commitSha, command: job.command });
    const answer: CreateJobResponse = { requestId, token, endpoint: options.runnerUrl, userData };
    return Response.json(answer, { status: 201 });
  }

  async function jobLog(rawId: string, follow: boolean, signal: AbortSignal): Promise<Response> {
    const requestId = normalizeRequestId(decodeURIComponent(rawId));
    if (!requestId) throw new RunnerDepotError("INVALID_ARGUMENT", `not a request ID: ${rawId}`);
    const state = await options.logs.get(requestId);
    if (!state) throw new RunnerDepotError("NOT_FOUND", `no job ${requestId}`);
    const encoder = new TextEncoder();
    const { runner, logs } = options;
    // NDJSON: one {line, stderr} per stored line, then {result} once the job has ended.
    const body = new ReadableStream<Uint8Array>({
      async start(controller) {
        try {
          if (follow) {
            for await (const line of runner.follow(requestId, { signal })) controller.enqueue(encoder.encode(`${JSON.stringify(line)}\n`));
          } else {
            for (let from = 0; ; ) {
              const page = await logs.read(requestId, from, 10_000);
              for (const line of page) controller.enqueue(encoder.encode(`${JSON.stringify(line)}\n`));
              if (page.length < 10_000) break;
              from += page.length;
            }
          }
          const after = await logs.get(requestId);
          if (after?.result) controller.enqueue(encoder.encode(`${JSON.stringify({ result: after.result })}\n`));
          controller.close();
        } catch (error) {
          controller.error(error);
        }
      },
    });
    return new Response(body, { headers: { "content-type": "application/x-ndjson", "cache-control": "no-store" } });
  }
}
