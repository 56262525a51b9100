/**
 * docs/runner-protocol.md §14 held to the code: the worked example's forms are what the
 * masker masks, and the refusal messages are the ones it throws.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { checkSecret, createSecretMasker, MASK_TEXT, secretForms } from "../../src/runner/masking/secret-masker.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");

async function section14(): Promise<string> {
  const text = await readFile(path.join(root, "docs", "runner-protocol.md"), "utf8");
  const start = text.indexOf("\n## 14. Secret masking");
  expect(start).toBeGreaterThan(-1);
  const next = text.indexOf("\n## ", start + 1);
  return text.slice(start, next === -1 ? undefined : next);
}

describe("docs/runner-protocol.md §14", () => {
  it("every form in the example table for `a+b/c?` is one the masker masks, and each is masked", async () => {
    const section = await section14();
    const rows = section.split("\n").filter((l) => l.startsWith("| ") && !l.startsWith("| form"));
    const examples = rows.flatMap((row) => {
      const cells = row.slice(1, -1).split(" | ");
      return [...(cells[1] ?? "").matchAll(/`([^`]+)`/g)].map((m) => m[1]!).filter((x) => x !== "\\n");
    });
    expect(examples.length).toBeGreaterThanOrEqual(10);
    const forms = secretForms("a+b/c?");
    const masker = createSecretMasker(["a+b/c?"]);
    for (const example of examples) {
      expect(forms, example).toContain(example);
      expect(masker.mask(`<${example}>`)).toBe(`<${MASK_TEXT}>`);
    }
  });

  it("states the replacement text and the refusal messages the code uses", async () => {
    const section = (await section14()).replace(/\s+/g, " ");
    expect(section).toContain(`is \`${MASK_TEXT}\``);
    const messages: string[] = [];
    for (const bad of ["abc", "ab\ncd"]) {
      try {
        checkSecret(bad);
      } catch (e) {
        messages.push((e as Error).message.replace("(got 3)", "(got N)"));
      }
    }
    expect(messages).toHaveLength(2);
    for (const m of messages) expect(section).toContain(m);
  });
});
