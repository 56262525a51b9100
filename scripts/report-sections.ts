/**
 * Shared by `npm run bench` (BENCHMARKS.md) and `npm run soak` (RELIABILITY.md): runs the
 * named modules of a folder (each exports `run(options): Promise<string>` returning one
 * Markdown section) and writes the report with the machine and the date.
 *
 * Why sections are merged: running a subset (`npm run bench -- depot-scale`) replaces only
 * those modules' sections and keeps every other section as the last full run left it, so
 * one module can be re-measured without wiping the others. Each section is framed by
 * `<!-- section:<name> -->` … `<!-- /section:<name> -->`.
 */
import { existsSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";

/** What {@link writeReport} needs. */
export interface ReportSpec {
  /** The folder holding `<module>.ts` files. */
  dir: string;
  /** Every module, in report order. */
  modules: readonly string[];
  /** The modules to run now (empty: all). */
  only: readonly string[];
  /** The report file. */
  file: string;
  /** Its `# Title`. */
  title: string;
  /** The command that writes it, e.g. `npm run bench`. */
  command: string;
  /** Lines under the machine line (method notes shared by every section). */
  preamble: string[];
  /** Passed to each module's `run`. */
  options?: Record<string, unknown>;
}

/** This machine, as each section written on it names it. */
export function machineName(): string {
  const cpus = os.cpus();
  return (
    `${cpus.length} × ${cpus[0]?.model.trim() ?? "unknown CPU"}, ${Math.round(os.totalmem() / 2 ** 30)} GiB RAM, ` +
    `${os.type()} ${os.release()}, Node ${process.version}`
  );
}

/** Splits an existing report into its named sections. */
export function parseSections(text: string): Map<string, string> {
  const sections = new Map<string, string>();
  const re = /<!-- section:([\w-]+) -->\n([\s\S]*?)\n<!-- \/section:\1 -->/g;
  for (const match of text.matchAll(re)) sections.set(match[1]!, match[2]!);
  return sections;
}

/** Runs the selected modules and writes the report, keeping the sections of the others; returns the fresh sections by module. */
export async function writeReport(spec: ReportSpec): Promise<Map<string, string>> {
  const previous = existsSync(spec.file) ? parseSections(await readFile(spec.file, "utf8")) : new Map<string, string>();
  const unknown = spec.only.filter((name) => !spec.modules.includes(name));
  if (unknown.length > 0)
    throw new Error(`unknown module(s): ${unknown.join(", ")}; known: ${spec.modules.join(", ")}`);
  const written = new Map<string, { text: string; date: string }>();
  for (const name of spec.modules) {
    if (spec.only.length > 0 && !spec.only.includes(name)) continue;
    const file = path.join(spec.dir, `${name}.ts`);
    if (!existsSync(file)) continue;
    console.error(`${spec.command}: ${name}…`);
    const mod = (await import(pathToFileURL(file).href)) as { run(options?: Record<string, unknown>): Promise<string> };
    written.set(name, { text: await mod.run(spec.options), date: new Date().toISOString().slice(0, 10) });
  }
  const body: string[] = [];
  for (const name of spec.modules) {
    const fresh = written.get(name);
    // A section carries its own date, since a partial run leaves older sections in place.
    // And its own machine: runs on different days may be on different machines (Intel and AMD hosts of one kind).
    const text = fresh ? `_Measured ${fresh.date} on ${machineName()}._\n\n${fresh.text.trim()}` : previous.get(name);
    if (text !== undefined) body.push(`<!-- section:${name} -->\n${text}\n<!-- /section:${name} -->`);
  }
  const header = [
    `# ${spec.title}`,
    "",
    `Written by \`${spec.command}\`; last run ${new Date().toISOString().slice(0, 10)}` +
      `${written.size > 0 ? ` (${[...written.keys()].join(", ")})` : ""}, on ${machineName()}.`,
    "",
    "Each section names the day of the run that wrote it, and since 2026-11-30 its machine; a section without a machine of its own was measured on its day's machine, not necessarily this one.",
    "",
    ...spec.preamble,
    "",
  ].join("\n");
  await writeFile(spec.file, `${header}\n${body.join("\n\n")}\n`);
  console.error(`${spec.command}: wrote ${path.basename(spec.file)}`);
  return new Map([...written].map(([name, { text }]) => [name, text]));
}
