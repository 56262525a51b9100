/** Counts the names each package entry exports (what an embedder sees) and lists those without a doc comment. */
// Usage: npx tsx scripts/public-surface.ts [-v]   (-v also prints every name). docs/decisions/public-surface.md.
import fs from "node:fs";
import path from "node:path";
import ts from "typescript";

const root = path.resolve(import.meta.dirname, "..");
// The entries are TypeDoc's entry points, which test/docs/api-reference.test.ts keeps equal to package.json exports.
const entries: string[] = JSON.parse(fs.readFileSync(path.join(root, "typedoc.json"), "utf8")).entryPoints;
const config = ts.getParsedCommandLineOfConfigFile(
  path.join(root, "tsconfig.json"),
  {},
  {
    ...ts.sys,
    onUnRecoverableConfigFileDiagnostic: () => {},
  },
)!;
const program = ts.createProgram(
  entries.map((e) => path.join(root, e)),
  config.options,
);
const checker = program.getTypeChecker();
const verbose = process.argv.includes("-v");
let total = 0;
const undocumented = new Set<string>();
for (const entry of entries) {
  const module = checker.getSymbolAtLocation(program.getSourceFile(path.join(root, entry))!)!;
  const names = checker.getExportsOfModule(module);
  total += names.length;
  console.log(`${String(names.length).padStart(4)} ${entry}`);
  if (verbose)
    console.log(
      `     ${names
        .map((s) => s.name)
        .sort()
        .join(" ")}`,
    );
  for (const name of names) {
    const target = name.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(name) : name;
    if (target.getDocumentationComment(checker).length === 0) undocumented.add(`${name.name} (${entry})`);
  }
}
console.log(`${String(total).padStart(4)} in all`);
console.log(
  undocumented.size ? `without a doc comment: ${[...undocumented].join(", ")}` : "every name has a doc comment",
);
