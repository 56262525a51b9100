/**
 * The normative documents hold where a sentence can be checked mechanically: the job-token
 * test vector, the marker-line texts and the job-result fields of docs/runner-protocol.md
 * (against a real server and client over h2c), and the error-code table of
 * docs/depot-api.md (against src/errors.ts and openapi.yaml).
 */
import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";
import { describe, expect, it } from "vitest";
import { RunnerDepotError, type ErrorCode } from "../../src/errors.js";
import { createMemoryLogStore, createMemoryQueue } from "../../src/adapters/memory/index.js";
import { createRunnerClient, createRunnerService, mintJobToken, startRunnerServer } from "../../src/runner/index.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const doc = (name: string) => readFile(path.join(root, "docs", name), "utf8");

/** The lines of the Markdown section whose heading is `## <heading>`. */
function section(markdown: string, heading: string): string {
  const start = markdown.indexOf(`\n## ${heading}`);
  if (start === -1) throw new Error(`no section ${heading}`);
  const next = markdown.indexOf("\n## ", start + 1);
  return markdown.slice(start, next === -1 ? undefined : next);
}

/** Rows of the first Markdown table in `text`, as cell arrays (header and rule dropped). */
function tableRows(text: string): string[][] {
  const rows = text.split("\n").filter((line) => line.startsWith("|"));
  return rows.slice(2).map((row) =>
    row
      .slice(1, -1)
      .split(" | ")
      .map((cell) => cell.trim()),
  );
}

describe("docs/runner-protocol.md", () => {
  it("the job-token test vector is what mintJobToken computes, for either letter case of the ID", async () => {
    const text = await doc("runner-protocol.md");
    const m = /the secret\s+`([^`]+)` and the ID `([^`]+)`[\s\S]*?give\s+the token `([^`]+)`/.exec(text);
    expect(m).not.toBeNull();
    const [, secret, id, token] = m!;
    expect(mintJobToken(secret!, id!)).toBe(token);
    expect(mintJobToken(secret!, id!.toLowerCase())).toBe(token);
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
  });

  it("the marker lines and the job result are exactly as documented (real server and client)", async () => {
    const text = await doc("runner-protocol.md");
    const templates = [...section(text, "7. Limits").matchAll(/^- `(\[runner-depot\][^`]+)`$/gm)].map((m) => m[1]!);
    expect(templates).toHaveLength(3);
    const asPattern = (template: string) =>
      new RegExp(`^${template.replace(/[.*+?^${}()|[\]\\]/g, "\\$&").replace(/<[^>]+>/g, "\\d+")}$`);

    const queue = createMemoryQueue();
    const logs = createMemoryLogStore();
    const secret = "docs-test-secret";
    const runner = createRunnerService(queue, {
      logs,
      secret,
      limits: { lineBytes: 16, jobLogBytes: 140, tailBytes: 0 },
    });
    const server = await startRunnerServer(runner, { port: 0 });
    const requestId = randomUUID();
    const client = createRunnerClient({
      endpoint: server.url,
      requestId,
      token: mintJobToken(secret, requestId),
      maxLineBytes: 1024,
    });
    try {
      // Each stored line counts 16 + its bytes (§7): x cut 32 + its marker 64 + y 32 = 128.
      client.log("x".repeat(30)); // over the line limit: cut to 16 bytes + a marker
      client.log("y".repeat(16)); // 128 counted so far
      client.log("z".repeat(16), true); // would cross 140: the cap marker instead
      client.log("never stored");
      await client.end({ exitCode: 3, success: false, repoUrl: "r", commitSha: "c" });
    } finally {
      await client.close();
      await server.close();
      await runner.close();
    }
    const stored = await logs.read(requestId.toLowerCase());
    expect(stored.map((l) => l.line)).toEqual([
      "x".repeat(16),
      expect.stringMatching(asPattern(templates[0]!)),
      "y".repeat(16),
      expect.stringMatching(asPattern(templates[1]!)),
    ]);
    expect(stored[1]!.line).toBe("[runner-depot] line truncated: 30 bytes, kept 16");
    expect(stored[3]).toMatchObject({ marker: true, stderr: true });

    // §8: the result's members are exactly the documented table's, with the documented values.
    const result = await queue.next();
    const fields = tableRows(section(text, "8. The job result").split("```").at(-1)!).flatMap((row) =>
      row[0]!.split(", ").map((f) => f.replace(/`/g, "")),
    );
    expect(Object.keys(result).sort()).toEqual([...fields].sort());
    expect(result).toMatchObject({
      requestId: requestId.toLowerCase(),
      outcome: "finished",
      exitCode: 3,
      success: false,
      logTruncated: true,
      lines: { stdout: 3, stderr: 1 },
    });
  });

  it("the drop marker of a cut log is exactly as documented (real server and client)", async () => {
    const text = await doc("runner-protocol.md");
    const templates = [...section(text, "7. Limits").matchAll(/^- `(\[runner-depot\][^`]+)`$/gm)].map((m) => m[1]!);
    const asPattern = (template: string) =>
      new RegExp(`^${template.replace(/[.*+?^${}()|[\]\\]/g, "\\$&").replace(/<[^>]+>/g, "\\d+")}$`);
    const logs = createMemoryLogStore();
    const secret = "docs-test-secret";
    // A 400-byte limit: a 300-byte head, a 100-byte tail; each line below counts 16 + 34 = 50.
    const runner = createRunnerService(createMemoryQueue(), { logs, secret, limits: { jobLogBytes: 400 } });
    const server = await startRunnerServer(runner, { port: 0 });
    const requestId = randomUUID();
    const client = createRunnerClient({ endpoint: server.url, requestId, token: mintJobToken(secret, requestId) });
    try {
      for (let i = 0; i < 20; i++) client.log(`line ${String(i).padStart(2, "0")} ${"·".repeat(12)}`);
      client.log("FATAL: no space left on device", true);
      await client.end({ exitCode: 1, success: false, repoUrl: "r", commitSha: "c" });
    } finally {
      await client.close();
      await server.close();
      await runner.close();
    }
    const stored = await logs.read(requestId.toLowerCase());
    const markers = stored.filter((l) => l.marker);
    expect(markers).toHaveLength(1);
    expect(markers[0]!.line).toMatch(asPattern(templates[2]!));
    expect(stored.at(-1)!.line).toBe("FATAL: no space left on device");
  });

  it("every status code the table names is a code the runner can send", async () => {
    const rows = tableRows(section(await doc("runner-protocol.md"), "9. Status codes"));
    const codes = rows.map((row) => row[0]!.replace(/`/g, ""));
    expect(codes).toContain("FAILED_PRECONDITION");
    for (const code of codes) expect(new RunnerDepotError(code as ErrorCode, "x").grpcCode).toBeTypeOf("number");
  });
});

describe("docs/depot-api.md", () => {
  it("the error table gives every depot code of openapi.yaml, each with the status the router sends", async () => {
    const rows = tableRows(section(await doc("depot-api.md"), "10. Errors"));
    const documented = new Map<string, number>();
    for (const [status, codes] of rows) {
      for (const code of codes!.split(", ")) {
        const name = code.replace(/`/g, "");
        expect(documented.has(name), `${name} has one row in docs/depot-api.md §10, not two`).toBe(false);
        documented.set(name, Number(status));
      }
    }
    for (const [code, status] of documented)
      expect([code, new RunnerDepotError(code as ErrorCode, "x").status]).toEqual([code, status]);
    const openapi = parse(await readFile(path.join(root, "openapi.yaml"), "utf8")) as {
      components: { schemas: { ErrorCode: { enum: string[] } } };
    };
    expect(
      [...documented.keys()].sort(),
      "docs/depot-api.md §10 lists exactly the codes of openapi.yaml's ErrorCode: add a row for a new code",
    ).toEqual([...openapi.components.schemas.ErrorCode.enum].sort());
  });
});
