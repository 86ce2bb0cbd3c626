#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t sz=(size_t)1<<30; int huge=atoi(argv[1]);
  char*b=mmap(0,sz+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  b=(char*)(((uintptr_t)b+(2<<20)-1)&~(uintptr_t)((2<<20)-1));
  if(huge) madvise(b,sz,MADV_HUGEPAGE); else madvise(b,sz,MADV_NOHUGEPAGE);
  memset(b,1,sz);
  int n=1<<20; uint64_t*idx=malloc(8*n); uint64_t s=88172645463325252ull;
  for(int lines=1;lines<=16;lines*=2){
    for(int i=0;i<n;i++){s^=s<<13;s^=s>>7;s^=s<<17; idx[i]=(s%(sz/(64*lines)))*(64*lines);}
    int rows=n/ (lines>4?lines/4:1);
    double t=now(); uint64_t acc=0;
    for(int i=0;i<rows;i++){ char*p=b+idx[i]; if(i+16<rows) for(int l=0;l<lines;l++) __builtin_prefetch(b+idx[i+16]+64*l);
      for(int l=0;l<lines;l++) acc+=p[64*l]; }
    t=now()-t;
    printf("huge=%d rows of %2d lines: %.1f ns/row %.2f ns/line %.2f GB/s (%lu)\n",huge,lines,t/rows*1e9,t/rows/lines*1e9,(double)rows*lines*64/t/1e9,acc&1);
  }
}
