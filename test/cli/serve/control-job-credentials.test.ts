/**
 * A job allowed to publish gets `RUNNER_DEPOT_TOKEN=job.<id>.<token>` in its environment;
 * CI scripts print it (`env`, `set -x` before a `curl -H "Authorization: Bearer …"`). Whoever
 * reads the job's log could then publish as the job while it runs, and the orchestrator
 * would sign that version's provenance. The control API now hands the token to the agent
 * and the service as a secret, so the stored log never holds it. Real HTTP to the control
 * API, real gRPC to the runner service.
 */
import { describe, expect, it } from "vitest";
import { parse } from "yaml";
import { line, send, startHarness } from "../../fixtures/runner-service.js";
import { serveControlApi } from "../../fixtures/control-http.js";

const SECRET = "s".repeat(32);

describe("control API: a publishing job's credentials stay out of its log", () => {
  it("masks the job's token in the stored log and tells the agent to mask it", async () => {
    const runner = await startHarness({ secret: SECRET });
    const server = await serveControlApi({
      runner: runner.runner,
      logs: runner.logs,
      secret: SECRET,
      runnerUrl: "http://10.0.2.100:50051",
      depotUrl: () => "http://10.0.2.100:8080",
    });
    try {
      const created = await fetch(`${server.url}/-/jobs`, {
        method: "POST",
        headers: { authorization: "Bearer admin", "content-type": "application/json" },
        body: JSON.stringify({ command: ["sh", "-c", "env"], publish: ["tool"] }),
      });
      expect(created.status).toBe(201);
      const job = (await created.json()) as { requestId: string; token: string; userData: string };
      const credentials = `job.${job.requestId}.${job.token}`;
      const doc = parse(job.userData) as { write_files: { content: string }[] };
      const config = JSON.parse(doc.write_files[0]!.content) as { env: Record<string, string>; secrets?: string[] };
      expect(config.env.RUNNER_DEPOT_TOKEN).toBe(credentials);
      // The agent masks it before a line leaves the VM.
      expect(config.secrets).toContain(job.token);

      // An agent that does not mask (an older one, or one started by hand): the service does.
      const sent = await send(
        runner.client,
        [
          line(job.requestId, `RUNNER_DEPOT_TOKEN=${credentials}`),
          line(job.requestId, `+ curl -H 'Authorization: Bearer ${credentials}'`),
        ],
        { token: job.token },
      );
      expect(sent.ok).toBe(true);
      const log = await fetch(`${server.url}/-/jobs/${job.requestId}/log`, {
        headers: { authorization: "Bearer admin" },
      });
      const text = await log.text();
      expect(text).toContain("RUNNER_DEPOT_TOKEN=job.");
      expect(text).not.toContain(job.token);
    } finally {
      await server.close();
      await runner.close();
    }
  });
});
