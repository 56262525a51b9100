/**
 * renderCloudInit warns of an endpoint or agent URL a VM reaches itself at: besides
 * 127.0.0.0/8 and ::1, what `serve --host 0.0.0.0` reports as its URL (the unspecified
 * address, which Linux connects to the local host) and `localhost` names. Before, those
 * went to the VM without a word and the job was lost after its timeout.
 */
import { describe, expect, it } from "vitest";
import { renderCloudInit } from "../../../src/runner/agent/cloud-init.js";

const base = { requestId: "0b5f0c8e-7d3a-4c1e-9f2a-1b2c3d4e5f60", token: "t", command: ["make"] };

function warningsFor(host: string): string[] {
  const warnings: string[] = [];
  renderCloudInit({
    ...base,
    endpoint: `http://${host}:50051`,
    agent: { url: `http://${host}:8080/data/runner-depot-agent-linux-x64@1.0.0`, sha256: "a".repeat(64) },
    onWarning: (m) => warnings.push(m),
  });
  return warnings;
}

describe("renderCloudInit's warnings of addresses a VM reaches itself at", () => {
  it.each(["0.0.0.0", "[::]", "[0:0:0:0:0:0:0:0]", "localhost.", "runner.localhost", "127.0.0.2", "[::1]"])(
    "warns for %s, once for the endpoint and once for the agent URL",
    (host) => {
      const warnings = warningsFor(host);
      expect(warnings).toHaveLength(2);
      expect(warnings[0]).toMatch(/^the runner endpoint .* is a loopback address/);
      expect(warnings[1]).toMatch(/^the agent URL .* is a loopback address/);
    },
  );

  it.each(["10.0.2.100", "runner.internal", "localhost.example", "[fd00::1]", "0.0.0.1"])(
    "says nothing for %s",
    (host) => {
      expect(warningsFor(host)).toEqual([]);
    },
  );
});
