"""The dashboard's HTML: one self-contained page (inline CSS and script, no CDN).

The server renders a section per job (header, the DAG as SVG, a card of small charts
per vertex, a table per vertex, the snapshot history, the size of each stateful vertex's
state and a key search over the last committed snapshot); the script polls ``/api/jobs``
every second and writes the numbers into elements marked with ``data-*`` attributes,
fetching the section of a job that appeared since. The charts draw the server's history
(:mod:`slipstream.dashboard.history`): the first poll brings the last minutes, later ones
only the points after the newest the page has (``?since=``). Data is written with
``textContent`` and SVG attributes only, so nothing a job reports can inject markup.
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
.warn{color:#8a5a00;font-family:monospace;white-space:pre-wrap}
.dagbox{overflow-x:auto;border:1px solid #dde3ea;border-radius:6px;margin:6px 0 10px 0;cursor:zoom-in}
.dagbox svg{display:block;max-width:100%;height:auto}
.dagbox.natural{cursor:zoom-out}.dagbox.natural svg{max-width:none}
h3{font-size:14px;margin:12px 0 6px 0;color:#14233a}
h3 .note{font-weight:normal;font-size:12px;color:#5a6b80;margin-left:8px}
.key{display:inline-block;width:14px;height:3px;vertical-align:middle;margin:0 3px 0 8px}
.k-in{background:#35608f}.k-out{background:#3a9a5b}.k-lag{background:#8a5fb0}.k-fill{background:#c47a1c}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:8px;margin-bottom:10px}
.vchart{border:1px solid #dde3ea;border-radius:6px;padding:6px 8px;min-width:0}
.vchart .vname{font-weight:600;font-size:13px;margin-bottom:2px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.chart{display:flex;align-items:center;gap:6px;font-size:11px;color:#5a6b80;height:34px}
.chart .lbl{width:52px;flex:none}
.chart svg.spark{flex:1 1 auto;min-width:0;height:30px;background:#f4f7fb;border-radius:3px}
.chart .val{width:78px;flex:none;text-align:right;font-family:monospace;color:#14233a;line-height:1.2}
.chart .val small{display:block;color:#5a6b80}
svg.spark path{fill:none;stroke-width:1.5;vector-effect:non-scaling-stroke;stroke-linejoin:round}
svg.spark path.in{stroke:#35608f}svg.spark path.out{stroke:#3a9a5b}
svg.spark path.lag{stroke:#8a5fb0}svg.spark path.fill{stroke:#c47a1c}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{padding:3px 8px;text-align:right;border-bottom:1px solid #e4e9ef}
th:first-child,td:first-child{text-align:left}
td.num{font-family:monospace}
.bar{display:inline-block;width:70px;height:8px;background:#dfe6ee;vertical-align:middle;margin-right:4px}
.bar i{display:block;height:100%;background:#3a9a5b}
.empty{color:#5a6b80}
table.members tfoot td{font-weight:600;border-top:2px solid #c9d3de}
form.statesearch{margin:8px 0 4px 0;font-size:13px;display:flex;flex-wrap:wrap;gap:8px;align-items:center}
form.statesearch input{font:13px monospace;width:16em}
form.statesearch .hint{font-size:12px;color:#5a6b80}
.stateresult{font-size:13px;margin-bottom:6px}
.stateresult.error{color:#b3261e}.stateresult.missing{color:#8a5a00}
.stateresult table{width:auto;min-width:40%;margin-top:4px}
.stateresult th,.stateresult td{text-align:left}
.stateresult td.value,.stateresult td.detail{font-family:monospace;white-space:pre-wrap;word-break:break-all}
"""

_SCRIPT = """
(function(){
  var POLL=%(poll)d, updates=0, since=null, hist={};
  var SVGNS='http://www.w3.org/2000/svg', W=300, H=30;
  function fmtN(x){if(x===null||x===undefined)return '\\u2013';
    var a=Math.abs(x);if(a>=1e9)return (x/1e9).toFixed(1)+'G';if(a>=1e6)return (x/1e6).toFixed(1)+'M';
    if(a>=1e4)return (x/1e3).toFixed(1)+'k';return String(Math.round(x*10)/10);}
  function fmtMs(ms){if(ms===null||ms===undefined)return '\\u2013';
    if(Math.abs(ms)<10)return ms.toFixed(2)+' ms';
    if(Math.abs(ms)<1000)return Math.round(ms)+' ms';return (ms/1000).toFixed(1)+' s';}
  function fmtB(b){if(b===null||b===undefined)return '\\u2013';
    if(b>=1048576)return (b/1048576).toFixed(1)+' MiB';if(b>=1024)return (b/1024).toFixed(1)+' KiB';return b+' B';}
  function fmtPct(f){return f===null||f===undefined?'\\u2013':Math.round(f*100)+'%%';}
  function set(root,sel,text){var els=root.querySelectorAll(sel);
    for(var i=0;i<els.length;i++){if(els[i].textContent!==text)els[i].textContent=text;}}
  function esc(s){return (window.CSS&&CSS.escape)?CSS.escape(s):s.replace(/["\\\\]/g,'\\\\$&');}
  // the server's history of a job, kept here for the charts: new points appended,
  // points older than the span dropped
  function merge(jid,h){
    var k=hist[jid];if(!k){k=hist[jid]={t:[],v:{},span:h.span_s};}
    var n=h.t.length;if(!n)return k;
    var old=k.t.length;k.t=k.t.concat(h.t);
    Object.keys(h.vertices).forEach(function(name){
      var src=h.vertices[name],dst=k.v[name];
      if(!dst){dst=k.v[name]={};Object.keys(src).forEach(function(s){
        dst[s]=new Array(old).fill(null);});}
      Object.keys(src).forEach(function(s){dst[s]=dst[s].concat(src[s]);});});
    Object.keys(k.v).forEach(function(name){Object.keys(k.v[name]).forEach(function(s){
      var a=k.v[name][s];while(a.length<k.t.length)a.push(null);});});
    var last=k.t[k.t.length-1],cut=0;while(cut<k.t.length&&k.t[cut]<last-k.span)cut++;
    if(cut){k.t=k.t.slice(cut);Object.keys(k.v).forEach(function(name){
      Object.keys(k.v[name]).forEach(function(s){k.v[name][s]=k.v[name][s].slice(cut);});});}
    return k;}
  function maxOf(arrs){var m=0;arrs.forEach(function(a){a.forEach(function(x){
    if(x!==null&&x>m)m=x;});});return m;}
  // a line from the oldest kept point (at most span seconds back) to the newest; no
  // line where a figure is unknown
  function pathD(ts,vs,span,max){
    var t1=ts[ts.length-1],d='',pen=false;
    for(var i=0;i<ts.length;i++){var v=vs[i];
      if(v===null||v===undefined){pen=false;continue;}
      var x=W-(t1-ts[i])/span*W, y=H-1-(H-2)*(max>0?Math.min(v/max,1):0);
      d+=(pen?'L':'M')+x.toFixed(1)+','+y.toFixed(1);pen=true;}
    return d;}
  function range(k){return Math.max(k.t.length?k.t[k.t.length-1]-k.t[0]:0,1);}
  function fmtRange(s){return s<90?Math.round(s)+' s':Math.round(s/60)+' min';}
  function draw(card,k,name){
    var v=k.v[name];if(!v||!k.t.length)return;
    var span=range(k);
    var rmax=maxOf([v.in_rate,v.out_rate]), lmax=maxOf([v.watermark_lag_ms]);
    var lines={'in':[v.in_rate,rmax],'out':[v.out_rate,rmax],'lag':[v.watermark_lag_ms,lmax],'fill':[v.queue_fill,1]};
    Object.keys(lines).forEach(function(c){var p=card.querySelector('path.'+c);
      if(p)p.setAttribute('d',pathD(k.t,lines[c][0],span,lines[c][1]));});
    set(card,'[data-f=rate_max]','max '+fmtN(rmax)+'/s');
    set(card,'[data-f=lag_max]',lmax>0?'max '+fmtMs(lmax):'');
    set(card,'[data-f=fill_max]','max '+fmtPct(maxOf([v.queue_fill])));}
  function snapRows(sec,j){
    var body=sec.querySelector('table.snapshots tbody');if(!body)return;
    var list=(j.snapshot_history||[]).slice().reverse();
    set(sec,'[data-f=snapcount]',j.snapshots?(j.snapshots+' committed'+(list.length<j.snapshots?
      '; listed: the last '+list.length+' the dashboard saw (it reads the last commit once a second)':'')):'');
    var key=list.map(function(s){return s.id+':'+s.committed_at+':'+s.pause_ms;}).join(',');
    if(body.getAttribute('data-key')===key)return;
    body.setAttribute('data-key',key);while(body.firstChild)body.removeChild(body.firstChild);
    if(!list.length){var tr=document.createElement('tr'),td=document.createElement('td');
      td.colSpan=6;td.className='empty';td.textContent='none yet';tr.appendChild(td);body.appendChild(tr);return;}
    list.forEach(function(s){var tr=document.createElement('tr');
      [String(s.id),new Date(s.committed_at*1000).toLocaleTimeString(),fmtMs(s.duration_ms),fmtB(s.bytes),
       s.entries===undefined||s.entries===null?'\\u2013':String(s.entries),fmtMs(s.pause_ms)].forEach(function(t,i){
        var td=document.createElement('td');if(i)td.className='num';td.textContent=t;tr.appendChild(td);});
      body.appendChild(tr);});}
  function updateJob(sec,j){
    var st=sec.querySelector('.status');st.textContent=j.status;st.className='status '+j.status;
    set(sec,'[data-f=elapsed]',j.elapsed_s===null?'\\u2013':j.elapsed_s+' s');
    set(sec,'[data-f=restarts]',String(j.restarts));
    var s=j.snapshot;
    set(sec,'[data-f=snapshot]',s?('#'+s.id+', '+fmtMs(s.duration_ms)+', '+fmtB(s.bytes)+', '+s.age_s+' s ago'):'none yet');
    set(sec,'[data-f=error]',j.error||'');
    set(sec,'[data-f=warnings]',(j.warnings||[]).join('\\n'));
    var sg=sec.querySelector('[data-f=stages]');
    if(sg&&j.stages&&j.stages.length){sg.parentNode.style.display='';
      set(sec,'[data-f=stages]',j.stages.slice(-3).map(function(x){
        return '#'+x.id+' '+x.tasks_done+'/'+x.tasks_total+(x.tasks_active?' ('+x.tasks_active+' running)':'');}).join(', '));}
    var k=merge(j.id,j.history);
    set(sec,'[data-f=range]',k.t.length?fmtRange(range(k)):'');
    j.vertices.forEach(function(v){
      var row=sec.querySelector('tr[data-vertex="'+esc(v.name)+'"]');
      if(row){
        set(row,'[data-f=in_rate]',fmtN(v.in_rate)+'/s');
        set(row,'[data-f=out_rate]',fmtN(v.out_rate)+'/s');
        set(row,'[data-f=items_in]',String(v.items_in));
        set(row,'[data-f=items_out]',String(v.items_out));
        set(row,'[data-f=queue_fill]',fmtPct(v.queue_fill));
        var bar=row.querySelector('.bar i');if(bar)bar.style.width=Math.round((v.queue_fill||0)*100)+'%%';
        set(row,'[data-f=watermark]',v.watermark===null?'\\u2013':
            (v.watermark_lag_ms!==null?new Date(v.watermark).toISOString().substr(11,12):String(v.watermark)));
        set(row,'[data-f=watermark_lag]',fmtMs(v.watermark_lag_ms));
        set(row,'[data-f=late]',String(v.late_items_dropped));
        set(row,'[data-f=skipped]',String(v.items_skipped||0));
        set(row,'[data-f=parallelism]',v.parallelism===null?'\\u2013':String(v.parallelism));
      }
      var card=sec.querySelector('.vchart[data-vertex="'+esc(v.name)+'"]');
      if(card){
        set(card,'[data-f=rate_now]',(v.items_in||!v.items_out?fmtN(v.in_rate):fmtN(v.out_rate))+'/s');
        set(card,'[data-f=lag_now]',fmtMs(v.watermark_lag_ms));
        set(card,'[data-f=fill_now]',fmtPct(v.queue_fill));
        draw(card,k,v.name);
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
    snapRows(sec,j);
    stateRows(sec,j);
    memberRows(sec,j);
  }
  // a job whose members run in processes: a row per member and the total
  function memberRows(sec,j){
    var box=sec.querySelector('div.members');if(!box)return;
    var list=j.members||[];box.style.display=list.length?'':'none';if(!list.length)return;
    var body=box.querySelector('tbody');
    function cells(tr,r,first){
      [[first,''],[r.pid===undefined||r.pid===null?'':String(r.pid),'pid'],[r.state||'','state'],
       [String(r.items_in),'items_in'],[String(r.items_out),'items_out'],
       [(r.cpu_ms/1000).toFixed(1)+' s','cpu'],[fmtPct(r.cpu_share),'cpu_share'],
       [fmtB(r.rss_kb*1024),'rss'],[fmtB(r.peak_rss_kb*1024),'peak_rss']].forEach(function(c,i){
        var td=tr.children[i];if(!td){td=document.createElement('td');if(i>=3)td.className='num';
          td.setAttribute('data-f',c[1]||'member');tr.appendChild(td);}
        if(td.textContent!==c[0])td.textContent=c[0];});}
    list.forEach(function(r){
      var tr=body.querySelector('tr[data-member="'+r.member+'"]');
      if(!tr){tr=document.createElement('tr');tr.setAttribute('data-member',String(r.member));body.appendChild(tr);}
      cells(tr,r,'member '+r.member);});
    var t=j.members_total,ft=box.querySelector('tfoot tr');
    if(t&&ft)cells(ft,{pid:null,state:t.members+' processes',items_in:t.items_in,items_out:t.items_out,
      cpu_ms:t.cpu_ms,cpu_share:t.cpu_share,rss_kb:t.rss_kb,peak_rss_kb:t.peak_rss_kb},'total');
  }
  // the size of each stateful vertex's state (see docs/watching.md, "State")
  function stateRows(sec,j){
    var body=sec.querySelector('table.state tbody');if(!body)return;
    var st=j.state,list=(st&&st.vertices)||[];
    set(sec,'[data-f=statenote]',st===null||st===undefined?'this job takes no snapshots':
      st.snapshot_id===null?'no snapshot committed yet':'as of snapshot #'+st.snapshot_id+
      (st.counted_snapshot_id!==null&&st.counted_snapshot_id!==st.snapshot_id?
        ' (keys and entries counted in #'+st.counted_snapshot_id+')':''));
    var key=JSON.stringify(list);
    if(body.getAttribute('data-key')===key)return;
    body.setAttribute('data-key',key);while(body.firstChild)body.removeChild(body.firstChild);
    if(!list.length){var tr=document.createElement('tr'),td=document.createElement('td');
      td.colSpan=6;td.className='empty';td.textContent=st&&st.snapshot_id!==null?'no vertex holds state':'none yet';
      tr.appendChild(td);body.appendChild(tr);}
    list.forEach(function(v){var tr=document.createElement('tr');tr.setAttribute('data-vertex',v.name);
      [[v.name,''],[v.keys===null?'\\u2013':String(v.keys),'keys'],[v.entries===null?'\\u2013':String(v.entries),'entries'],
       [fmtB(v.bytes),'bytes'],[String(v.chunks),'chunks'],[String(v.processors),'processors']].forEach(function(c,i){
        var td=document.createElement('td');if(i)td.className='num';if(c[1])td.setAttribute('data-f',c[1]);
        td.textContent=c[0];tr.appendChild(td);});
      body.appendChild(tr);});
    // the search's vertex choice: the vertices with state, once a snapshot names them
    var sel=sec.querySelector('form.statesearch select');
    var names=list.map(function(v){return v.name;});
    if(sel&&names.length&&sel.getAttribute('data-names')!==names.join('\\n')){
      var was=sel.value;sel.setAttribute('data-names',names.join('\\n'));
      while(sel.firstChild)sel.removeChild(sel.firstChild);
      names.forEach(function(n){var o=document.createElement('option');o.value=n;o.textContent=n;sel.appendChild(o);});
      if(names.indexOf(was)>=0)sel.value=was;}
    // until the user chooses, the first vertex with keys is chosen
    var keyed=list.filter(function(v){return v.keys;})[0];
    if(sel&&keyed&&!sel.hasAttribute('data-chosen')&&sel.value!==keyed.name)sel.value=keyed.name;
  }
  function showState(out,d){
    while(out.firstChild)out.removeChild(out.firstChild);
    var what=d.error?'error':d.found?'found':'missing';
    out.className='stateresult '+what;out.setAttribute('data-state',what);
    if(d.error||!d.found){out.textContent=d.error||d.message;return;}
    var p=document.createElement('div');
    p.textContent=d.key_repr+' in '+d.vertex+', snapshot #'+d.snapshot_id+':';out.appendChild(p);
    var t=document.createElement('table'),h=document.createElement('tr');
    ['processor','kind','detail','value'].forEach(function(x){var th=document.createElement('th');th.textContent=x;h.appendChild(th);});
    t.appendChild(h);
    d.rows.forEach(function(r){var tr=document.createElement('tr');
      [[String(r.processor),'num'],[r.kind,''],[r.detail===null?'':JSON.stringify(r.detail),'detail'],
       [r.value_repr,'value']].forEach(function(c){var td=document.createElement('td');td.className=c[1];
        td.textContent=c[0];tr.appendChild(td);});
      t.appendChild(tr);});
    out.appendChild(t);}
  document.addEventListener('change',function(e){
    if(e.target.closest&&e.target.closest('form.statesearch')&&e.target.name==='vertex')
      e.target.setAttribute('data-chosen','');});
  document.addEventListener('submit',function(e){
    var form=e.target;if(!form.classList||!form.classList.contains('statesearch'))return;
    e.preventDefault();
    var sec=form.closest('section.job'),out=sec.querySelector('.stateresult');
    out.removeAttribute('data-state');out.className='stateresult';out.textContent='looking up\\u2026';
    fetch('api/jobs/'+encodeURIComponent(sec.getAttribute('data-job'))+'/state?vertex='+
      encodeURIComponent(form.elements.vertex.value)+'&key='+encodeURIComponent(form.elements.key.value),{cache:'no-store'})
      .then(function(r){return r.text();})
      .then(function(t){var d;try{d=JSON.parse(t);}catch(x){d={error:t};}showState(out,d);})
      .catch(function(err){showState(out,{error:'no contact with the engine: '+err});});
  });
  document.addEventListener('click',function(e){
    var box=e.target.closest&&e.target.closest('.dagbox');if(box)box.classList.toggle('natural');});
  function poll(){
    var url='api/jobs'+(since===null?'':'?since='+since);
    fetch(url,{cache:'no-store'}).then(function(r){return r.json();}).then(function(d){
      var main=document.querySelector('main'), pending=[];
      var empty=main.querySelector('.empty');if(empty&&d.jobs.length)empty.remove();
      d.jobs.forEach(function(j){
        var ts=j.history.t;if(ts.length&&(since===null||ts[ts.length-1]>since))since=ts[ts.length-1];
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


def _spark(lbl: str, paths: str, now: str, peak: str) -> str:
    return (
        f'<div class="chart"><span class="lbl">{lbl}</span>'
        f'<svg class="spark" viewBox="0 0 300 30" preserveAspectRatio="none">{paths}</svg>'
        f'<span class="val"><span data-f="{now}"></span><small data-f="{peak}"></small></span></div>'
    )


def _chart_card(vertex: str) -> str:
    """A vertex's small charts of the last minutes: items per second (in and out),
    watermark lag, queue fill; each with its current value and its maximum (the scale's
    top; queue fill's scale is 0-100 %)."""
    return (
        f'<div class="vchart" data-vertex="{escape(vertex)}"><div class="vname">{escape(vertex)}</div>'
        + _spark("items/s", '<path class="in"/><path class="out"/>', "rate_now", "rate_max")
        + _spark("wm lag", '<path class="lag"/>', "lag_now", "lag_max")
        + _spark("queue fill", '<path class="fill"/>', "fill_now", "fill_max")
        + "</div>"
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
        '<td class="num" data-f="late"></td><td class="num" data-f="skipped"></td></tr>'
        for v in vertices
    )
    charts = "".join(_chart_card(v) for v in vertices)
    options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in vertices)
    return (
        f'<section class="job" id="job-{jid}" data-job="{jid}">'
        f'<h2>{escape(name)} <span class="status"></span></h2>'
        '<div class="facts"><span>elapsed <b data-f="elapsed"></b></span>'
        '<span>restarts <b data-f="restarts"></b></span>'
        '<span>last snapshot <b data-f="snapshot"></b></span>'
        '<span style="display:none">Spark stages (tasks done/total) <b data-f="stages"></b></span></div>'
        '<div class="error" data-f="error"></div>'
        '<div class="warn" data-f="warnings"></div>'
        f'<div class="dagbox" title="click: actual size / fit the page">{svg}</div>'
        '<h3>History <span class="note">last <span data-f="range"></span>, a point a second'
        '<i class="key k-in"></i>items in/s'
        '<i class="key k-out"></i>items out/s<i class="key k-lag"></i>watermark lag'
        '<i class="key k-fill"></i>queue fill (0-100 %)</span></h3>'
        f'<div class="charts">{charts}</div>'
        "<table class=\"vertices\"><thead><tr><th>vertex</th><th>processors</th><th>in/s</th><th>out/s</th>"
        "<th>items in</th><th>items out</th><th>queue fill</th><th>watermark</th>"
        "<th>watermark lag</th><th>late dropped</th>"
        '<th title="items set aside because user code raised on them (on_item_error)">'
        "skipped</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        '<div class="members" style="display:none"><h3>Members<span class="note">one process '
        "each; items summed over the member's processors, CPU as a share of one core over the "
        "last second</span></h3>"
        '<table class="members"><thead><tr><th>member</th><th>pid</th><th>state</th>'
        "<th>items in</th><th>items out</th><th>CPU</th><th>CPU now</th><th>RSS</th>"
        '<th>peak RSS</th></tr></thead><tbody></tbody><tfoot><tr class="total"></tr></tfoot>'
        "</table></div>"
        '<h3>Snapshots<span class="note" data-f="snapcount"></span></h3>'
        '<table class="snapshots"><thead><tr><th>id</th><th>committed</th><th>duration</th>'
        "<th>size</th><th>entries</th><th>longest pause</th></tr></thead><tbody></tbody></table>"
        '<h3>State<span class="note" data-f="statenote"></span></h3>'
        '<table class="state"><thead><tr><th>vertex</th>'
        '<th title="distinct keys of its keyed, window and session state">keys</th>'
        '<th title="rows of ss.state.read: keys, window frames, sessions, offsets">entries</th>'
        '<th title="the chunk files its state is in">on disk</th><th>chunks</th>'
        "<th>processors</th></tr></thead><tbody></tbody></table>"
        f'<form class="statesearch"><label>vertex <select name="vertex">{options}</select></label>'
        '<label>key <input name="key" type="text" autocomplete="off" spellcheck="false" '
        'placeholder="alice, 42 or &quot;42&quot;"></label><button type="submit">look up</button>'
        '<span class="hint">read as JSON when it is JSON: 42 is an int, "42" a string, '
        '[1, "a"] a tuple; other text is a string</span></form>'
        '<div class="stateresult"></div>'
        "</section>"
    )
