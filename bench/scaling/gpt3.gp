# The planner's best grid for the GPT-3 configs (solid) and the Llama 3 configs (dashed)
# against the number of GPUs (bench/scaling.sh writes the data: one block per model;
# columns gpus step_s mfu_pct bubble mem_gb pp dp tp). Variables (gnuplot -e): dat,
# models (GPT-3: the file and the labels of its blocks, space-separated), dat2, models2
# (Llama 3; models2 = '' draws none), what (step | mfu | memory | bubble), cluster (its
# name), term (svg | pngcairo | png), out.
if (term eq 'svg') {
  set terminal svg size 720, 440 font 'Helvetica,12' background rgb 'white'
} else {
  if (term eq 'pngcairo') {
    set terminal pngcairo size 720, 440 font 'Helvetica,10'
  } else {
    set terminal png size 720, 440
  }
}
set output out
set logscale x 2
set xrange [6:22000]
set xtics (8, 32, 128, 512, 2048, 8192, 16384)
set xlabel 'GPUs'
set grid xtics ytics lc rgb '#dddddd'
if (!exists("models2")) models2 = ''
if (!exists("dat2")) dat2 = ''
set key outside right top font ',10'
n = words(models)
n2 = words(models2)
set style line 1 lc rgb '#1f77b4' lw 2 pt 7 ps 0.6
set style line 2 lc rgb '#ff7f0e' lw 2 pt 5 ps 0.6
set style line 3 lc rgb '#2ca02c' lw 2 pt 9 ps 0.7
set style line 4 lc rgb '#d62728' lw 2 pt 11 ps 0.7
set style line 5 lc rgb '#9467bd' lw 2 pt 13 ps 0.7
set style line 6 lc rgb '#8c564b' lw 2 pt 4 ps 0.6
set style line 7 lc rgb '#e377c2' lw 2 pt 6 ps 0.6
set style line 8 lc rgb '#333333' lw 2 pt 8 ps 0.7
if (what eq 'step') {
  set logscale y 10
  set ylabel 'seconds per step (paper global batch)'
  set title sprintf('Predicted step time of the best grid, %s', cluster)
  col = 2
}
if (what eq 'mfu') {
  set yrange [0:*]
  set ylabel 'MFU (%)'
  set title sprintf('Predicted MFU of the best grid, %s', cluster)
  col = 3
}
if (what eq 'memory') {
  set yrange [0:*]
  set ylabel 'GB per device (the fullest rank)'
  set title sprintf('Predicted memory per device of the best grid, %s', cluster)
  col = 5
}
if (what eq 'bubble') {
  set yrange [0:1]
  set ylabel 'bubble (idle share of the step)'
  set title sprintf('Predicted pipeline bubble of the best grid, %s', cluster)
  col = 4
}
# Llama 3: dashed, filled points, in the colours after GPT-3's
do for [j = 1:8] {
  set style line 10 + j lc rgb word('#17becf #bcbd22 #7f7f7f #1f77b4 #ff7f0e #2ca02c #d62728 #9467bd', j) lw 2 dt 2 pt 5 + 2 * (j % 4) ps 0.8
}
if (n2 > 0) {
  plot for [i = 0:n - 1] dat index i using 1:col with linespoints ls (i % 8 + 1) title 'GPT-3 '.word(models, i + 1), \
       for [i = 0:n2 - 1] dat2 index i using 1:col with linespoints ls (11 + i % 8) title 'Llama 3 '.word(models2, i + 1)
} else {
  plot for [i = 0:n - 1] dat index i using 1:col with linespoints ls (i % 8 + 1) title 'GPT-3 '.word(models, i + 1)
}
