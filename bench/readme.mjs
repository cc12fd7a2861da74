#!/usr/bin/env node
// Writes (or checks) the README's benchmark block from bench/results/latest.json.
//
//   node bench/readme.mjs --check                 exit 1 when the README's block is not what the results give
//   node bench/readme.mjs --write [--bracket=F]   rewrite the block; F: a summary of an earlier run,
//                                                 shown in brackets (default: the one the README names)
//   node bench/readme.mjs --summary=OUT           write latest.json's summary (kept in bench/results/runs/)
//     [--commit=REV]                              the commit of a run from before runs recorded theirs
//   --results=FILE                                a results file other than bench/results/latest.json
// File options are relative to the current directory; the bracket the README's marker names is
// relative to the repository.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { readBlock, renderBlock, summarize, writeBlock } from './lib/readme-summary.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const opt = (name) => argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
const known = /^--(check|write|summary=.+|commit=.+|bracket=.+|results=.+)$/;
const unknown = argv.filter((a) => !known.test(a));
const fail = (message) => {
  process.stderr.write(`${message}usage: node bench/readme.mjs --check | --write [--bracket=SUMMARY.json] | --summary=OUT.json [--commit=REV]  [--results=latest.json]\n`);
  process.exit(2);
};
if (unknown.length || argv.length === 0) fail(unknown.length ? `unknown option ${unknown.join(' ')}\n` : '');
if (opt('commit') !== undefined && opt('summary') === undefined) fail('--commit names the run of a summary: use it with --summary\n');

const resultsFile = opt('results') ? path.resolve(opt('results')) : path.join(ROOT, 'bench/results/latest.json');
const summary = summarize(JSON.parse(fs.readFileSync(resultsFile, 'utf8')));
const summaryOut = opt('summary');
const given = opt('commit');
if (given !== undefined) {
  // Only for a run that predates meta.commit; the name must be a commit of this repository.
  const rev = spawnSync('git', ['rev-parse', '--verify', '--quiet', '--short', `${given}^{commit}`], { cwd: ROOT, encoding: 'utf8' });
  if (rev.status !== 0) fail(`--commit=${given}: not a commit of this repository\n`);
  const short = rev.stdout.trim();
  if (summary.meta.commit && !summary.meta.commit.startsWith(short)) fail(`--commit=${given}: the results record their commit, ${summary.meta.commit}\n`);
  summary.meta.commit ??= short;
}
if (summaryOut) {
  fs.writeFileSync(summaryOut, `${JSON.stringify(summary, null, 1)}\n`);
  process.stdout.write(`wrote ${summaryOut}\n`);
}
if (argv.includes('--write') || argv.includes('--check')) {
  const readmeFile = path.join(ROOT, 'README.md');
  const readme = fs.readFileSync(readmeFile, 'utf8');
  const block = readBlock(readme);
  const named = block.bracket;
  const bracketFile = opt('bracket') ? path.resolve(opt('bracket')) : named ? path.join(ROOT, named) : null;
  const bracket = bracketFile ? JSON.parse(fs.readFileSync(bracketFile, 'utf8')) : null;
  const body = renderBlock(summary, bracket);
  if (argv.includes('--write')) {
    const rel = bracketFile ? path.relative(ROOT, bracketFile).split(path.sep).join('/') : null;
    fs.writeFileSync(readmeFile, writeBlock(readme, body, rel));
    process.stdout.write(`README.md: benchmark block written from ${path.relative(ROOT, resultsFile)}${rel ? `, bracket ${rel}` : ''}\n`);
  } else if (block.body !== body) {
    process.stderr.write(`README.md's benchmark block is not what ${path.relative(ROOT, resultsFile)} gives: run node bench/readme.mjs --write\n`);
    process.exit(1);
  } else process.stdout.write('README.md: benchmark block matches the results\n');
}
