/** Lists every export of every module under src/ (src/gen aside) with the files that reference it. */
// Usage: npx tsx scripts/export-users.ts [src/some/folder] > exports.tsv  (about 3 minutes for all of src/).
// Columns: PUBLIC (reached from a package entry), OWNFILE (no other file uses it: unexport it, or delete
// it if its own file does not use it either), TESTONLY, SHARED; the module; the name; its users.
import ts from "typescript";
import path from "node:path";
import fs from "node:fs";
const root = path.resolve(import.meta.dirname, "..");
// The entries are TypeDoc's entry points, which test/docs/api-reference.test.ts keeps equal to package.json exports.
const entries: string[] = JSON.parse(fs.readFileSync(path.join(root, "typedoc.json"), "utf8")).entryPoints.map(
  (e: string) => path.join(root, e),
);
const cfg = ts.getParsedCommandLineOfConfigFile(path.join(root, "tsconfig.json"), {}, {
  ...ts.sys,
  onUnRecoverableConfigFileDiagnostic() {},
} as any)!;
const files = cfg.fileNames;
const host: ts.LanguageServiceHost = {
  getScriptFileNames: () => files,
  getScriptVersion: () => "1",
  getScriptSnapshot: (f) => (fs.existsSync(f) ? ts.ScriptSnapshot.fromString(fs.readFileSync(f, "utf8")) : undefined),
  getCurrentDirectory: () => root,
  getCompilationSettings: () => cfg.options,
  getDefaultLibFileName: ts.getDefaultLibFilePath,
  fileExists: ts.sys.fileExists,
  readFile: ts.sys.readFile,
  readDirectory: ts.sys.readDirectory,
  directoryExists: ts.sys.directoryExists,
  getDirectories: ts.sys.getDirectories,
};
const ls = ts.createLanguageService(host);
const program = ls.getProgram()!;
const checker = program.getTypeChecker();
const publicSyms = new Set<ts.Symbol>();
for (const e of entries) {
  const sf = program.getSourceFile(e)!;
  for (const s of checker.getExportsOfModule(checker.getSymbolAtLocation(sf)!))
    publicSyms.add(s.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(s) : s);
}
const rel = (f: string) => path.relative(root, f);
const kind = (f: string) => {
  const r = rel(f);
  if (entries.includes(f)) return "entry";
  if (r.startsWith("test/")) return "test";
  if (r.startsWith("src/cli/")) return "cli";
  if (r.startsWith("src/console/")) return "console";
  if (r.startsWith("src/")) return "src";
  return r.split("/")[0];
};
const only = process.argv[2];
for (const sf of program.getSourceFiles()) {
  const r = rel(sf.fileName);
  if (!r.startsWith("src/") || r.startsWith("src/gen/") || entries.includes(sf.fileName)) continue;
  if (only && !r.startsWith(only)) continue;
  const msym = checker.getSymbolAtLocation(sf);
  if (!msym) continue;
  for (const s of checker.getExportsOfModule(msym)) {
    const target = s.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(s) : s;
    const decl = s.declarations?.[0];
    if (!decl) continue;
    if (decl.getSourceFile() !== sf) continue; // re-export from elsewhere
    const nameNode = ts.getNameOfDeclaration(decl) ?? decl;
    const refs = ls.findReferences(sf.fileName, nameNode.getStart()) ?? [];
    const users = new Set<string>();
    for (const rs of refs)
      for (const ref of rs.references) {
        if (ref.fileName === sf.fileName) continue;
        users.add(kind(ref.fileName) + ":" + rel(ref.fileName));
      }
    const kinds = new Set([...users].map((u) => u.split(":")[0]));
    const pub = publicSyms.has(target);
    let cls = pub
      ? "PUBLIC"
      : users.size === 0
        ? "OWNFILE"
        : [...kinds].every((k) => k === "test")
          ? "TESTONLY"
          : "SHARED";
    console.log([cls, r, s.name, [...users].join(" ")].join("\t"));
  }
}
