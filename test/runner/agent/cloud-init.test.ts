/** renderCloudInit / readJobConfig: the rendered user data parsed as YAML, and a round trip through a real file. */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { isRunnerDepotError } from "../../../src/errors.js";
import {
  DEFAULT_JOB_CONFIG_PATH,
  readJobConfig,
  renderCloudInit,
  type JobConfig,
} from "../../../src/runner/agent/cloud-init.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-cloud-init-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const requestId = randomUUID().toUpperCase();
const token = mintJobToken("secret", requestId);

function render(extra: Partial<Parameters<typeof renderCloudInit>[0]> = {}) {
  return renderCloudInit({
    endpoint: "https://orchestrator.internal:50051",
    requestId,
    token,
    repoUrl: "https://git.example.com/team/app.git",
    commitSha: "9fceb02d0ae598e95dc970b74767f19372d61af8",
    command: "make test && echo 'done: \"ok\"' # not a comment",
    ...extra,
  });
}

describe("renderCloudInit", () => {
  it("renders #cloud-config with the job config (0600) in write_files and the agent in runcmd", () => {
    const text = render({ env: { CI: "true", QUOTE: "a: 'b' \"c\"\n" }, cwd: "/work" });
    expect(text.split("\n")[0]).toBe("#cloud-config");
    const doc = parse(text) as { write_files: Array<Record<string, string>>; runcmd: string[][] };
    expect(Object.keys(doc).sort()).toEqual(["runcmd", "write_files"]);
    expect(doc.write_files).toHaveLength(1);
    const file = doc.write_files[0]!;
    expect(file.path).toBe(DEFAULT_JOB_CONFIG_PATH);
    expect(file.permissions).toBe("0600");
    expect(file.owner).toBe("root:root");
    const config = JSON.parse(file.content!) as JobConfig;
    expect(config).toEqual({
      version: 1,
      endpoint: "https://orchestrator.internal:50051",
      requestId: requestId.toLowerCase(),
      token,
      repoUrl: "https://git.example.com/team/app.git",
      commitSha: "9fceb02d0ae598e95dc970b74767f19372d61af8",
      command: "/bin/sh",
      args: ["-c", "make test && echo 'done: \"ok\"' # not a comment"],
      cwd: "/work",
      env: { CI: "true", QUOTE: "a: 'b' \"c\"\n" },
    });
    expect(doc.runcmd).toEqual([["runner-depot", "agent", "--config", DEFAULT_JOB_CONFIG_PATH]]);
  });

  it("takes an argv command, a custom agent command and config path", () => {
    const doc = parse(
      render({
        command: ["npm", "test"],
        args: ["--", "--ci"],
        agentCommand: ["/opt/agent/bin/agent", "run"],
        configPath: "/run/job.json",
      }),
    ) as {
      write_files: Array<Record<string, string>>;
      runcmd: string[][];
    };
    const config = JSON.parse(doc.write_files[0]!.content!) as JobConfig;
    expect(config.command).toBe("npm");
    expect(config.args).toEqual(["test", "--", "--ci"]);
    expect(doc.write_files[0]!.path).toBe("/run/job.json");
    expect(doc.runcmd).toEqual([["/opt/agent/bin/agent", "run", "--config", "/run/job.json"]]);
  });

  it("refuses bad input at render time with INVALID_ARGUMENT", () => {
    for (const bad of [
      { requestId: "not-a-uuid" },
      { endpoint: "ftp://x" },
      { endpoint: "no url" },
      { command: [] as string[] },
      { command: "" },
    ]) {
      let error: unknown;
      try {
        render(bad);
      } catch (e) {
        error = e;
      }
      expect(isRunnerDepotError(error, "INVALID_ARGUMENT"), JSON.stringify(bad)).toBe(true);
    }
  });
});

describe("readJobConfig", () => {
  it("round-trips the rendered config through a file", async () => {
    const ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const doc = parse(render({ command: ["make"], env: { A: "1" }, ca })) as {
      write_files: Array<Record<string, string>>;
    };
    const file = path.join(dir, "job.json");
    await writeFile(file, doc.write_files[0]!.content!, { mode: 0o600 });
    const config = await readJobConfig(file);
    expect(config.requestId).toBe(requestId.toLowerCase());
    expect(config.token).toBe(token);
    expect(config.command).toBe("make");
    expect(config.args).toEqual([]);
    expect(config.env).toEqual({ A: "1" });
    expect(config.ca).toBe(ca);
  });

  it("gives clear errors: missing file NOT_FOUND, bad JSON and bad fields INVALID_ARGUMENT", async () => {
    await expect(readJobConfig(path.join(dir, "missing.json"))).rejects.toMatchObject({ code: "NOT_FOUND" });
    const cases: Array<[string, RegExp]> = [
      ["{not json", /not valid JSON/],
      ["[]", /expected a JSON object/],
      [JSON.stringify({ version: 2 }), /unsupported version/],
      [JSON.stringify({ version: 1, endpoint: "x" }), /endpoint is not a URL/],
      [JSON.stringify({ version: 1, endpoint: "http://h:1", requestId: "nope" }), /requestId is not a UUID/],
      [JSON.stringify({ version: 1, endpoint: "http://h:1", requestId, token: 5 }), /token must be a string/],
      [
        JSON.stringify({
          version: 1,
          endpoint: "http://h:1",
          requestId,
          token: "",
          repoUrl: "",
          commitSha: "",
          command: "x",
          args: [1],
        }),
        /args must be an array of strings/,
      ],
      [
        JSON.stringify({
          version: 1,
          endpoint: "http://h:1",
          requestId,
          token: "",
          repoUrl: "",
          commitSha: "",
          command: "x",
          args: [],
          env: { A: 1 },
        }),
        /env.A must be a string/,
      ],
      [
        JSON.stringify({
          version: 1,
          endpoint: "http://h:1",
          requestId,
          token: "",
          repoUrl: "",
          commitSha: "",
          command: "x",
          args: [],
          ca: 7,
        }),
        /ca must be a string/,
      ],
    ];
    for (const [content, message] of cases) {
      const file = path.join(dir, `bad-${randomUUID()}.json`);
      await writeFile(file, content);
      await expect(readJobConfig(file)).rejects.toMatchObject({
        code: "INVALID_ARGUMENT",
        message: expect.stringMatching(message),
      });
    }
  });
});
