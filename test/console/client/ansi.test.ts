/** The log viewer's line renderer: what a terminal would show, as styled runs. */
import { describe, expect, it } from "vitest";
import { parseAnsiLine } from "../../../src/console/client/ansi.js";

const text = (line: string) =>
  parseAnsiLine(line)
    .map((r) => r.text)
    .join("");

describe("parseAnsiLine", () => {
  it("SGR colours and styles become classes; reset ends them", () => {
    expect(parseAnsiLine("\u001b[1;31merror:\u001b[0m ok")).toEqual([
      { text: "error:", cls: "a-b a-f1" },
      { text: " ok", cls: "" },
    ]);
    expect(parseAnsiLine("\u001b[92;44mhi\u001b[39mx\u001b[49;4mu\u001b[24m")).toEqual([
      { text: "hi", cls: "a-f10 a-g4" },
      { text: "x", cls: "a-g4" },
      { text: "u", cls: "a-u" },
    ]);
  });

  it("256-colour and true-colour become CSS colours; inverse swaps", () => {
    expect(parseAnsiLine("\u001b[38;5;196mr\u001b[48;2;1;2;3mb")).toEqual([
      { text: "r", cls: "", fg: "rgb(255,0,0)" },
      { text: "b", cls: "", fg: "rgb(255,0,0)", bg: "rgb(1,2,3)" },
    ]);
    expect(parseAnsiLine("\u001b[38;5;3my")).toEqual([{ text: "y", cls: "a-f3" }]);
    expect(parseAnsiLine("\u001b[7mi")).toEqual([{ text: "i", cls: "a-f0 a-g7" }]);
  });

  it("carriage returns overwrite from the start of the line, as a progress bar does", () => {
    expect(text("progress 10%\rprogress 100%")).toBe("progress 100%");
    expect(text("downloading 1/3\rdone")).toBe("doneloading 1/3");
    expect(text("abc\r\u001b[Kx")).toBe("x");
    expect(text("abc\b\bX")).toBe("aXc");
    expect(parseAnsiLine("\u001b[31m50%\u001b[0m\r\u001b[32m100%\u001b[0m")).toEqual([{ text: "100%", cls: "a-f2" }]);
  });

  it("other escapes and control characters are dropped, never shown raw", () => {
    expect(text("\u001b]0;title\u0007a\u001b]8;;http://x\u001b\\link\u001b]8;;\u001b\\b")).toBe("alinkb");
    expect(text("a\u001b[2Ab\u001b(Bc\u0000d\u007fe")).toBe("abcde");
    expect(text("tab\there")).toBe("tab     here");
    expect(text("\u001b[")).toBe("");
    expect(text("\u001b")).toBe("");
    expect(text("emoji 🚀 ok")).toBe("emoji 🚀 ok");
  });
});
