/**
 * renderCloudInit's user data as cloud-init reads it: with PyYAML (YAML 1.1), where NEL,
 * LS and PS are line breaks. A raw U+2028 in any job string (a commit SHA from a webhook,
 * an argument) used to end the config's block scalar and turn what followed into
 * cloud-config keys (`bootcmd`, run as root before the agent).
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { renderCloudInit, type CloudInitJob } from "../../../src/runner/agent/cloud-init.js";

const run = promisify(execFile);
const requestId = "0b5f0c8e-7d3a-4c1e-9f2a-1b2c3d4e5f60";
const agent = { url: "http://depot.internal:8080/data/runner-depot-agent-linux-x64@1.0.0", sha256: "a".repeat(64) };

/** Each document parsed by Debian's PyYAML (cloud-init's parser) in one /usr/bin/python3 process: its top-level keys and its job config text. */
async function pyyamlLoad(
  docs: string[],
): Promise<{ keys: string[]; path: unknown; content: string; runcmd: unknown }[]> {
  const script = `import json, sys, yaml
out = []
for text in json.load(sys.stdin):
    d = yaml.safe_load(text)
    f = d["write_files"][0]
    out.append({"keys": sorted(d.keys()), "path": f["path"], "content": f["content"], "runcmd": d["runcmd"]})
json.dump(out, sys.stdout)`;
  const child = run("/usr/bin/python3", ["-c", script], { maxBuffer: 64 * 2 ** 20 });
  child.child.stdin!.end(JSON.stringify(docs));
  return JSON.parse((await child).stdout) as { keys: string[]; path: unknown; content: string; runcmd: unknown }[];
}

describe("renderCloudInit read by cloud-init's YAML 1.1 parser", () => {
  it("keeps a value holding U+2028 inside the job config: no injected bootcmd", async () => {
    const commitSha = "x\u2028bootcmd: [[touch, /tmp/pwned]]\u2028z: |\u2028 ";
    const job: CloudInitJob = {
      endpoint: "http://10.0.2.100:1",
      requestId,
      token: "t",
      commitSha,
      command: ["make"],
      agent,
    };
    const [parsed] = await pyyamlLoad([renderCloudInit(job)]);
    expect(parsed!.keys).toEqual(["runcmd", "write_files"]);
    expect((JSON.parse(parsed!.content) as { commitSha: string }).commitSha).toBe(commitSha);
  });

  it("round-trips any job strings to the same config, with write_files and runcmd only", async () => {
    const text = fc.string({ unit: "binary", maxLength: 24 });
    const jobs = fc.sample(
      fc.record({
        commitSha: text,
        repoUrl: text,
        args: fc.array(
          text.filter((s) => s.length > 0),
          { minLength: 1, maxLength: 3 },
        ),
        env: fc.dictionary(text, text, { maxKeys: 2 }),
        cwd: text,
        withAgent: fc.boolean(),
      }),
      // Plus the characters that differ between YAML 1.1 and 1.2, in every field.
      300,
    );
    jobs.push({
      commitSha: "\u0085\u2028\u2029\u007f\u0080\ufeff",
      repoUrl: "a\u2028b",
      args: ["\u2029", "a\u0085b"],
      env: { "K\u2028": "v\u2028" },
      cwd: "/w\u2028",
      withAgent: true,
    });
    const rendered = jobs.map(({ withAgent, args, ...rest }) =>
      renderCloudInit({
        endpoint: "http://10.0.2.100:1",
        requestId,
        token: "t",
        command: args,
        ...rest,
        ...(withAgent ? { agent } : {}),
        onWarning: () => undefined,
      }),
    );
    const parsed = await pyyamlLoad(rendered);
    parsed.forEach((doc, i) => {
      const job = jobs[i]!;
      expect(doc.keys).toEqual(["runcmd", "write_files"]);
      const config = JSON.parse(doc.content) as Record<string, unknown>;
      expect(config).toMatchObject({
        commitSha: job.commitSha,
        repoUrl: job.repoUrl,
        command: job.args[0],
        args: job.args.slice(1),
        env: job.env,
        cwd: job.cwd,
      });
    });
  });

  it("hands cloud-init the runcmd argv and config path as strings, whatever they look like in YAML 1.1", async () => {
    const tricky = ["yes", "on", "Off", "1:30", "0b101", "1_000", "2001-12-14", "=", "<<", "~", "0777", ".inf"];
    const plain = fc.string({ unit: "grapheme-ascii", maxLength: 12 }).filter((s) => !/[\u0000-\u001f\u007f]/.test(s));
    const cases = fc.sample(fc.array(fc.oneof(fc.constantFrom(...tricky), plain), { minLength: 2, maxLength: 4 }), 100);
    cases.push(tricky);
    const rendered = cases.map((argv) =>
      renderCloudInit({
        endpoint: "http://10.0.2.100:1",
        requestId,
        token: "t",
        command: ["make"],
        agentCommand: argv.slice(1),
        configPath: argv[0]!,
      }),
    );
    const parsed = await pyyamlLoad(rendered);
    parsed.forEach((doc, i) => {
      const argv = cases[i]!;
      expect(doc.keys).toEqual(["runcmd", "write_files"]);
      expect(doc.path).toBe(argv[0]);
      expect(doc.runcmd).toEqual([[...argv.slice(1), "--config", argv[0]]]);
    });
    const [fetching] = await pyyamlLoad([
      renderCloudInit({
        endpoint: "http://10.0.2.100:1",
        requestId,
        token: "t",
        command: ["make"],
        agent,
        configPath: "yes",
      }),
    ]);
    expect((fetching!.runcmd as string[][])[0]!.slice(3)).toEqual([
      "runner-depot-fetch-agent",
      agent.url,
      agent.sha256,
      "yes",
      "/var/lib/runner-depot",
    ]);
  });

  it("refuses a config path or agent command cloud-init would read otherwise", () => {
    const base = { endpoint: "http://10.0.2.100:1", requestId, token: "t", command: ["make"] };
    expect(() => renderCloudInit({ ...base, configPath: "/etc/job\u2028.json" })).toThrow(/configPath/);
    expect(() => renderCloudInit({ ...base, agentCommand: ["agent\n"] })).toThrow(/agentCommand/);
  });
});
