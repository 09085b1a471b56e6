# Measured vs predicted step time on this machine (bench/scaling.sh writes the data).
# Variables (gnuplot -e): dir (the data folder), configs (labels, space-separated),
# term (svg | pngcairo | png), out (the file to write).
nc = words(configs)
if (term eq 'svg') {
  set terminal svg size 900, 330 * nc font 'Helvetica,12' background rgb 'white'
} else {
  if (term eq 'pngcairo') {
    set terminal pngcairo size 900, 330 * nc font 'Helvetica,10'
  } else {
    set terminal png size 900, 330 * nc
  }
}
set output out
set multiplot layout nc, 2 title "Step time on this 2-core machine: measured vs tessera plan --cluster this-machine.cfg" font ',11'
set logscale x 2
set xrange [0.8:5]
set xtics (1, 2, 4)
set xlabel 'ranks (1 thread each)'
set ylabel 'ms per step'
set yrange [0:*]
set grid ytics lc rgb '#dddddd'
set style line 1 lc rgb '#1f77b4' lw 2 pt 7 ps 0.8
set style line 2 lc rgb '#2ca02c' lw 2 pt 5 ps 0.8
set style line 3 lc rgb '#d62728' lw 2 pt 9 ps 0.9
kinds = 'dp pp tp'
do for [c = 1:nc] {
  do for [mode in 'strong weak'] {
    if (mode eq 'strong') { set key bottom left font ',9' samplen 2 } else { set key top left font ',9' samplen 2 }
    f = sprintf('%s/here_%s_%s.dat', dir, word(configs, c), mode)
    set title sprintf('%s, %s scaling (global batch %s)', word(configs, c), mode, \
                      mode eq 'strong' ? '16' : '16 x ranks') font ',10'
    plot for [k = 0:2] f index k using 1:2 with linespoints ls (k + 1) title word(kinds, k + 1).' measured', \
         for [k = 0:2] f index k using 1:3 with lines ls (k + 1) dt 2 notitle, \
         for [k = 0:2] f index k using 1:4 with points ls (k + 1) pt 2 ps 1.3 notitle, \
         NaN with lines lc rgb '#555555' lw 2 dt 2 title 'predicted', \
         NaN with points lc rgb '#555555' pt 2 ps 1.3 title 'predicted, time-shared'
  }
}
unset multiplot
