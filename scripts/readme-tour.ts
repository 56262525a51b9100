/**
 * The README's "A 60-second tour" as one program: its fenced code blocks, joined in order
 * (what the README tells a reader to paste into `tour.mts`). Printed on stdout when run
 * (`npx tsx scripts/readme-tour.ts > tour.mts`); test/docs/readme-tour.test.ts and
 * scripts/check-pack.sh run it, the test against this checkout's source and the pack check
 * against the installed tarball.
 */
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The heading of the tour's section in README.md. */
export const TOUR_HEADING = "A 60-second tour";

/** The fenced code blocks of the Markdown section whose `## ` heading starts with `heading`. */
export function sectionCodeBlocks(markdown: string, heading: string): { lang: string; code: string }[] {
  const lines = markdown.split("\n");
  const start = lines.findIndex((line) => line.startsWith(`## ${heading}`));
  if (start === -1) return [];
  const blocks: { lang: string; code: string }[] = [];
  let open: { lang: string; lines: string[] } | null = null;
  for (const line of lines.slice(start + 1)) {
    if (open === null && /^## /.test(line)) break;
    const fence = /^```(\S*)\s*$/.exec(line);
    if (fence && open === null) open = { lang: fence[1] ?? "", lines: [] };
    else if (fence && open !== null) {
      blocks.push({ lang: open.lang, code: open.lines.join("\n") });
      open = null;
    } else if (open !== null) open.lines.push(line);
  }
  return blocks;
}

/** The tour program: the section's blocks joined in order. */
export function tourProgram(readme: string): string {
  return `${sectionCodeBlocks(readme, TOUR_HEADING)
    .map((b) => b.code)
    .join("\n\n")}\n`;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
  process.stdout.write(tourProgram(readFileSync(path.join(root, "README.md"), "utf8")));
}
