"""The dashboard's HTML: one self-contained page (inline CSS and script, no CDN).

The server renders a section per job (header, the DAG as SVG, a table per vertex); the
script polls ``/api/jobs`` every second and writes the numbers into elements marked
with ``data-*`` attributes, fetching the section of a job that appeared since. Data is
written with ``textContent`` only, so nothing a job reports can inject markup.
"""

from __future__ import annotations

from html import escape

from slipstream import __version__

POLL_MS = 1000

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#eef2f6;color:#14233a}
header{background:#14233a;color:#fff;padding:10px 18px;display:flex;gap:16px;align-items:baseline}
header h1{font-size:18px;margin:0}
header .upd{margin-left:auto;font-size:12px;opacity:.8}
main{padding:12px 18px}
section.job{background:#fff;border-radius:8px;padding:12px 16px;margin-bottom:16px;
 box-shadow:0 1px 3px rgba(0,0,0,.12)}
section.job h2{font-size:16px;margin:0 0 6px 0}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;background:#999;color:#fff}
.status.running{background:#2f8a4c}.status.failed{background:#b3261e}
.status.completed{background:#35608f}.status.cancelled,.status.suspended{background:#8a6d2f}
.facts{font-size:13px;color:#3c4a5c;margin:4px 0 8px 0}
.facts span{margin-right:16px}
.error{color:#b3261e;font-family:monospace;white-space:pre-wrap}
.dagbox{overflow-x:auto;border:1px solid #dde3ea;border-radius:6px;margin:6px 0 10px 0}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{padding:3px 8px;text-align:right;border-bottom:1px solid #e4e9ef}
th:first-child,td:first-child{text-align:left}
td.num{font-family:monospace}
.bar{display:inline-block;width:70px;height:8px;background:#dfe6ee;vertical-align:middle;margin-right:4px}
.bar i{display:block;height:100%;background:#3a9a5b}
.empty{color:#5a6b80}
"""

_SCRIPT = """
(function(){
  var POLL=%(poll)d, updates=0;
  function fmtN(x){if(x===null||x===undefined)return '\\u2013';
    var a=Math.abs(x);if(a>=1e9)return (x/1e9).toFixed(1)+'G';if(a>=1e6)return (x/1e6).toFixed(1)+'M';
    if(a>=1e4)return (x/1e3).toFixed(1)+'k';return String(Math.round(x*10)/10);}
  function fmtMs(ms){if(ms===null||ms===undefined)return '\\u2013';
    if(Math.abs(ms)<1000)return Math.round(ms)+' ms';return (ms/1000).toFixed(1)+' s';}
  function fmtB(b){if(b===null||b===undefined)return '\\u2013';
    if(b>=1048576)return (b/1048576).toFixed(1)+' MiB';if(b>=1024)return (b/1024).toFixed(1)+' KiB';return b+' B';}
  function set(root,sel,text){var els=root.querySelectorAll(sel);
    for(var i=0;i<els.length;i++){if(els[i].textContent!==text)els[i].textContent=text;}}
  function esc(s){return (window.CSS&&CSS.escape)?CSS.escape(s):s.replace(/["\\\\]/g,'\\\\$&');}
  function updateJob(sec,j){
    var st=sec.querySelector('.status');st.textContent=j.status;st.className='status '+j.status;
    set(sec,'[data-f=elapsed]',j.elapsed_s===null?'\\u2013':j.elapsed_s+' s');
    set(sec,'[data-f=restarts]',String(j.restarts));
    var s=j.snapshot;
    set(sec,'[data-f=snapshot]',s?('#'+s.id+', '+fmtMs(s.duration_ms)+', '+fmtB(s.bytes)+', '+s.age_s+' s ago'):'none yet');
    set(sec,'[data-f=error]',j.error||'');
    var sg=sec.querySelector('[data-f=stages]');
    if(sg&&j.stages&&j.stages.length){sg.parentNode.style.display='';
      set(sec,'[data-f=stages]',j.stages.slice(-3).map(function(x){
        return '#'+x.id+' '+x.tasks_done+'/'+x.tasks_total+(x.tasks_active?' ('+x.tasks_active+' running)':'');}).join(', '));}
    j.vertices.forEach(function(v){
      var row=sec.querySelector('tr[data-vertex="'+esc(v.name)+'"]');
      if(row){
        set(row,'[data-f=in_rate]',fmtN(v.in_rate)+'/s');
        set(row,'[data-f=out_rate]',fmtN(v.out_rate)+'/s');
        set(row,'[data-f=items_in]',String(v.items_in));
        set(row,'[data-f=items_out]',String(v.items_out));
        set(row,'[data-f=queue_fill]',v.queue_fill===null?'\\u2013':Math.round(v.queue_fill*100)+'%%');
        var bar=row.querySelector('.bar i');if(bar)bar.style.width=Math.round((v.queue_fill||0)*100)+'%%';
        set(row,'[data-f=watermark]',v.watermark===null?'\\u2013':
            (v.watermark_lag_ms!==null?new Date(v.watermark).toISOString().substr(11,12):String(v.watermark)));
        set(row,'[data-f=watermark_lag]',fmtMs(v.watermark_lag_ms));
        set(row,'[data-f=late]',String(v.late_items_dropped));
        set(row,'[data-f=parallelism]',v.parallelism===null?'\\u2013':String(v.parallelism));
      }
      var g=sec.querySelector('g.vertex[data-vertex="'+esc(v.name)+'"]');
      if(g){
        set(g,'.m-rate','in '+fmtN(v.in_rate)+'/s  out '+fmtN(v.out_rate)+'/s');
        set(g,'.m-wm',v.watermark_lag_ms!==null?('wm lag '+fmtMs(v.watermark_lag_ms)):
            (v.watermark!==null?('wm '+v.watermark):'total '+fmtN(v.items_out)));
        var f=g.querySelector('.m-fill');
        if(f)f.setAttribute('width',String(Math.round((v.queue_fill||0)*parseFloat(f.getAttribute('data-full')))));
      }
    });
  }
  function poll(){
    fetch('api/jobs',{cache:'no-store'}).then(function(r){return r.json();}).then(function(d){
      var main=document.querySelector('main'), pending=[];
      var empty=main.querySelector('.empty');if(empty&&d.jobs.length)empty.remove();
      d.jobs.forEach(function(j){
        var sec=document.getElementById('job-'+j.id);
        if(sec){updateJob(sec,j);return;}
        pending.push(fetch('api/jobs/'+encodeURIComponent(j.id)+'/section').then(function(r){return r.text();})
          .then(function(html){
            if(document.getElementById('job-'+j.id))return;
            var t=document.createElement('template');t.innerHTML=html;main.appendChild(t.content);
            updateJob(document.getElementById('job-'+j.id),j);}));
      });
      return Promise.all(pending).then(function(){
        updates++;document.body.setAttribute('data-updates',String(updates));
        set(document,'header .upd','updated '+new Date(d.time*1000).toLocaleTimeString());});
    }).catch(function(e){set(document,'header .upd','no contact with the engine: '+e);})
      .then(function(){setTimeout(poll,POLL);});
  }
  poll();
})();
"""


def page_html(sections: list[str]) -> str:
    body = "\n".join(sections) or '<p class="empty">No jobs yet.</p>'
    script = _SCRIPT % {"poll": POLL_MS}
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>slipstream dashboard</title>"
        f"<style>{_CSS}</style></head><body data-updates=\"0\">"
        f"<header><h1>slipstream</h1><span>{escape(__version__)}</span>"
        "<span class=\"upd\"></span></header>"
        f"<main>{body}</main><script>{script}</script></body></html>"
    )


def job_section(job_id: str, name: str, svg: str, vertices: list[str]) -> str:
    """One job's section; the numbers are filled in by the script."""
    jid = escape(job_id)
    rows = "".join(
        f'<tr data-vertex="{escape(v)}"><td>{escape(v)}</td>'
        '<td class="num" data-f="parallelism"></td>'
        '<td class="num" data-f="in_rate"></td><td class="num" data-f="out_rate"></td>'
        '<td class="num" data-f="items_in"></td><td class="num" data-f="items_out"></td>'
        '<td class="num"><span class="bar"><i style="width:0"></i></span>'
        '<span data-f="queue_fill"></span></td>'
        '<td class="num" data-f="watermark"></td><td class="num" data-f="watermark_lag"></td>'
        '<td class="num" data-f="late"></td></tr>'
        for v in vertices
    )
    return (
        f'<section class="job" id="job-{jid}" data-job="{jid}">'
        f'<h2>{escape(name)} <span class="status"></span></h2>'
        '<div class="facts"><span>elapsed <b data-f="elapsed"></b></span>'
        '<span>restarts <b data-f="restarts"></b></span>'
        '<span>last snapshot <b data-f="snapshot"></b></span>'
        '<span style="display:none">Spark stages (tasks done/total) <b data-f="stages"></b></span></div>'
        '<div class="error" data-f="error"></div>'
        f'<div class="dagbox">{svg}</div>'
        "<table><thead><tr><th>vertex</th><th>processors</th><th>in/s</th><th>out/s</th>"
        "<th>items in</th><th>items out</th><th>queue fill</th><th>watermark</th>"
        "<th>watermark lag</th><th>late dropped</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )
